//! Compiles the GLSL kernels of `shaders/vulkan/` to SPIR-V with the vendored glslang of the
//! `glslang` crate (Vulkan 1.2, SPIR-V 1.5), one module per (kernel, weight format) variant, and
//! writes `kernels.rs` into `OUT_DIR`: a table of `(name, words)` the backend embeds.
//!
//! Each variant's source is `#define`s + the block layouts + `common.glsl` + the kernel body, so
//! every kernel shares one set of extensions, buffer-reference types and dequantisation functions.
//! The block layouts are `#define`s written here from backend-api's one definition of them
//! (`backend-api/src/block.rs`, compiled into this script on its own): `Q4_K_BYTES`, `Q4_K_QS`
//! and so on, each field's byte offset (see `block::BlockLayout::constants`); the same header is
//! written to `OUT_DIR/block_layouts.glsl` to read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The block formats' layouts: backend-api's `block` module, which names nothing else of its
/// crate. Only its table and `constants` are used here.
#[path = "../backend-api/src/block.rs"]
#[allow(dead_code)]
mod block;

/// `#define`s of every block format's layout (values and bytes per block, each field's byte
/// offset), from [`block::ALL`].
fn block_layout_defines() -> String {
    let mut s =
        String::from("// Block layouts, written by backend-vulkan/build.rs from backend-api/src/block.rs.\n");
    for layout in block::ALL.iter().filter(|l| l.is_quantized()) {
        for (name, value) in layout.constants() {
            writeln!(s, "#define {name} {value}").expect("write to a String");
        }
    }
    s
}

/// The weight formats a kernel that reads weights is built for (`WFMT_*` defines).
const FORMATS: [&str; 10] = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q6_k",
];

/// The block formats (`matvec_dot`'s weights).
const BLOCK_FORMATS: [&str; 7] = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q6_k"];

/// Kernels built once per weight format.
const PER_FORMAT: [&str; 9] = [
    "embed",
    "matmul",
    "matmul_tiled",
    "matvec",
    "matmul_coopmat",
    // The KHR path's kernel from 128 rows for q4_k (matmul_coopmat below them).
    "matmul_khr",
    // The KHR path's kernel from 128 rows for every format but q4_k: matmul_khr with k 64 at a
    // time.
    "matmul_khr64",
    "matmul_cm2",
    "dequant_f16",
];

/// Kernels built once.
const PLAIN: [&str; 23] = [
    "rms_norm",
    "rope",
    "kv_store",
    "attention",
    "attention_gqa",
    "attention_combine",
    "attention_tiled",
    // The experiment beside it (TANDEM_VULKAN_ATTN_COOPMAT=1).
    "attention_coopmat",
    "eltwise",
    "select_rows",
    "copy",
    "norm_add",
    "norm_rope",
    // matmul_cm2's f16 input, and the sum of its split-k slices.
    "to_f16",
    "matmul_reduce",
    // q4_k, one input row (decode).
    "matvec_q4k",
    // A row's best k values (the sampler's candidates).
    "top_k",
    // matvec_dot's input: blocks of 32 int8 values and their scale.
    "quantize_q8",
    // The vision tower's ops.
    "layer_norm",
    "bias_gelu",
    "block_attention",
    "block_attention_tiled",
    "block_attention_coopmat",
];

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders/vulkan");
    println!("cargo:rerun-if-changed={}", dir.display());
    let read = |name: &str| -> String {
        let p = dir.join(name);
        println!("cargo:rerun-if-changed={}", p.display());
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let common = read("common.glsl");
    let block_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../backend-api/src/block.rs");
    println!("cargo:rerun-if-changed={}", block_rs.display());
    let layouts = block_layout_defines();
    let compiler = glslang::Compiler::acquire().expect("glslang compiler");
    let target = |version, spirv_version| glslang::CompilerOptions {
        source_language: glslang::SourceLanguage::GLSL,
        target: glslang::Target::Vulkan {
            version,
            spirv_version,
        },
        version_profile: None,
        messages: glslang::ShaderMessage::DEFAULT,
    };
    let options = target(glslang::VulkanVersion::Vulkan1_2, glslang::SpirvVersion::SPIRV1_5);
    // GL_NV_cooperative_matrix2 needs SPIR-V 1.6 (the backend takes it only on Vulkan 1.3).
    let options_1_3 = target(glslang::VulkanVersion::Vulkan1_3, glslang::SpirvVersion::SPIRV1_6);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("block_layouts.glsl"), &layouts).expect("write block_layouts.glsl");
    let mut table = String::from(
        "/// Every kernel variant: name and SPIR-V words.\npub static KERNELS: &[(&str, &[u8])] = &[\n",
    );
    // `variant`: "" for the kernel itself, or the name of a build of it with more defines
    // (`cm2h`: matmul_cm2 with `ACC_F16`, named matmul_cm2h_<fmt>).
    let mut build = |kernel: &str, format: Option<&str>, variant: &str| {
        // `#include "name"` lines take the text of shaders/vulkan/name (one level: the included
        // files include nothing).
        let body: String = read(&format!("{kernel}.comp"))
            .lines()
            .map(|line| {
                match line
                    .trim()
                    .strip_prefix("#include \"")
                    .and_then(|r| r.strip_suffix('"'))
                {
                    Some(name) => read(name),
                    None => format!("{line}\n"),
                }
            })
            .collect();
        let mut defines = match format {
            Some(f) => format!("#define WFMT_{} 1\n", f.to_uppercase()),
            None => String::new(),
        };
        if variant == "cm2h" {
            defines.push_str("#define ACC_F16 1\n");
        }
        if variant == "khrp" {
            defines.push_str("#define PROBE_NO_WLOAD 1\n");
        }
        let kernel = match variant {
            "" => kernel.to_string(),
            _ => format!("matmul_{variant}"),
        };
        let kernel = kernel.as_str();
        let source = format!("#version 460\n{defines}{layouts}{common}\n#line 1 1\n{body}");
        let src = glslang::ShaderSource::from(source);
        let no_defines: Option<&[(&str, Option<&str>)]> = None;
        let opts = if kernel.starts_with("matmul_cm2") {
            &options_1_3
        } else {
            &options
        };
        let input = glslang::ShaderInput::new(&src, glslang::ShaderStage::Compute, opts, no_defines, None)
            .unwrap_or_else(|e| panic!("{kernel} ({format:?}): {e}"));
        let shader = compiler
            .create_shader(input)
            .unwrap_or_else(|e| panic!("{kernel} ({format:?}): {e}"));
        let words = shader
            .compile()
            .unwrap_or_else(|e| panic!("{kernel} ({format:?}): {e}"));
        let name = match format {
            Some(f) => format!("{kernel}_{f}"),
            None => kernel.to_string(),
        };
        let file = out_dir.join(format!("{name}.spv"));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
        writeln!(
            table,
            "    ({name:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.spv\"))),"
        )
        .expect("write to a String");
    };
    for k in PER_FORMAT {
        for f in FORMATS {
            build(k, Some(f), "");
        }
    }
    // matmul_cm2 with f16 accumulators (option `precision = "fast"`).
    for f in FORMATS {
        build("matmul_cm2", Some(f), "cm2h");
    }
    // A tuning probe: matmul_khr on f16 weights without their global loads (constant weights;
    // wrong results), TANDEM_VULKAN_COOPMAT_KERNEL=khrp; the other formats as matmul_khr.
    for f in FORMATS {
        build("matmul_khr", Some(f), "khrp");
    }

    for k in PLAIN {
        build(k, None, "");
    }
    // q4_k's kernel for several rows (batched decode).
    build("matvec_rows", Some("q4_k"), "");
    // Integer dot products against the quantised input (decode), block formats only.
    for f in BLOCK_FORMATS {
        build("matvec_dot", Some(f), "");
    }
    table.push_str("];\n");
    std::fs::write(out_dir.join("kernels.rs"), table).expect("write kernels.rs");
}
