//! Compiles the GLSL compute shaders in `shaders/` to SPIR-V with glslang
//! (vendored by the `glslang` crate, built with `cc`: no system shader
//! compiler), one module per kind for the products and row lookups
//! (`ferrox_ops::vulkan::KINDS`), and writes `shaders.rs`: the table of
//! `(name, SPIR-V bytes)` the device loads by name. The integer-dot
//! products (`matmul_dp_<suffix>`, `ferrox_ops::vulkan::DP_KINDS`) and their
//! activation quantizer (`quantize_q8`) are compiled too; the device runs
//! them only where it has `shaderIntegerDotProduct`.

use std::path::PathBuf;

const PLAIN: &[&str] = &["unary", "glu", "select", "rms_norm", "rope", "kv_store", "attention", "quantize_q8"];
const PER_KIND: &[&str] = &["matmul", "get_rows"];

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("shaders");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=shaders");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("shaders/{name}: {e}"));
    let common = read("common.glsl");
    let dequant = read("dequant.glsl");
    let compiler = glslang::Compiler::acquire().expect("glslang did not initialize");
    let options = glslang::CompilerOptions {
        source_language: glslang::SourceLanguage::GLSL,
        target: glslang::Target::Vulkan {
            version: glslang::VulkanVersion::Vulkan1_2,
            spirv_version: glslang::SpirvVersion::SPIRV1_5,
        },
        version_profile: None,
        messages: glslang::ShaderMessage::DEFAULT,
    };
    let mut jobs: Vec<(String, String)> = Vec::new();
    let head = format!("#version 460\n#define TILE {}\n#define ROWS {}u\n", ferrox_ops::vulkan::MATMUL_TILE, ferrox_ops::vulkan::MATMUL_ROWS);
    for name in PLAIN {
        jobs.push((name.to_string(), format!("{head}{common}\n{}", read(&format!("{name}.comp")))));
    }
    for name in PER_KIND {
        let body = read(&format!("{name}.comp"));
        for &(_, suffix) in ferrox_ops::vulkan::KINDS {
            let define = format!("#define KIND_{}\n", suffix.to_ascii_uppercase());
            jobs.push((format!("{name}_{suffix}"), format!("{head}{define}{common}\n{dequant}\n{body}")));
        }
    }
    let dp = read("matmul_dp.comp");
    for &kind in ferrox_ops::vulkan::DP_KINDS {
        let suffix = ferrox_ops::vulkan::suffix(kind).expect("an integer-dot kind is in KINDS");
        let define = format!("#define KIND_{}\n", suffix.to_ascii_uppercase());
        jobs.push((format!("matmul_dp_{suffix}"), format!("{head}{define}{common}\n{dp}")));
    }
    let mut table = String::from("/// Every compiled shader: `(name, SPIR-V)`.\npub static SHADERS: &[(&str, &[u8])] = &[\n");
    for (name, src) in jobs {
        let source = glslang::ShaderSource::from(src);
        let input = glslang::ShaderInput::new(&source, glslang::ShaderStage::Compute, &options, None::<&[(&str, Option<&str>)]>, None)
            .unwrap_or_else(|e| panic!("shader {name}: {e}"));
        let words = compiler.create_shader(input).and_then(|s| s.compile()).unwrap_or_else(|e| panic!("shader {name}: {e}"));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(out.join(format!("{name}.spv")), bytes).unwrap();
        table.push_str(&format!("    (\"{name}\", include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.spv\"))),\n"));
    }
    table.push_str("];\n");
    std::fs::write(out.join("shaders.rs"), table).unwrap();
}
