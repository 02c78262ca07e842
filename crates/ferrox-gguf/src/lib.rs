//! The GGUF container. (Skeleton.)
