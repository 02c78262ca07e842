//! The ferrox engine and the API the CLI and server use.
//!
//! Today it holds model-level operations that need both the container and
//! the block formats: [`requantize`] (`ferrox quantize`). The generic decoder,
//! the backend seam and the kernel registry join it with the engine.
#![deny(missing_docs)]

pub mod chat_template;
pub mod embed;
pub mod ftype;
pub mod requantize;
pub mod sampling;
pub mod tokenizer;
pub mod arch;
pub mod backend;
pub mod kernel_registry;
pub mod model;
pub mod generate;
pub mod perplexity;
pub mod scheduler;
pub mod speculative;
pub mod testing;
