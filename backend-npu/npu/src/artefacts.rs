//! Prebuilt NPU kernels: the `manifest.json` that `shaders/npu/build.sh` writes beside the
//! `.xclbin` and instruction-stream files, checked before anything reaches the device: the
//! format, the kernel ABI, the generation it was built for, and each file's sha256.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::contract::{KernelShape, Phase, ABI_VERSION, KV_BLOCK, PREFILL_Q_BLOCK};

/// The manifest format this build reads.
pub const MANIFEST_FORMAT: u32 = 1;
/// The manifest's file name in an artefact directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The environment variable naming the artefact directory.
pub const ARTEFACTS_VAR: &str = "TANDEM_NPU_ARTEFACTS";

/// Why artefacts cannot be used; each names the file and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtefactError {
    /// No manifest where one was looked for.
    #[error("no NPU kernel artefacts: {} does not exist (build them with shaders/npu/build.sh on a machine with the AIE toolchain, then point [backend.npu] artefacts or {ARTEFACTS_VAR} at the directory)", path.display())]
    Missing {
        /// The manifest path looked for.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("{}: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The manifest.
        path: PathBuf,
        /// serde's message (naming the field, line and column).
        reason: String,
    },
    /// A field has a value this build cannot use.
    #[error("{}: field `{field}` is {found}, {expected}", path.display())]
    Field {
        /// The manifest.
        path: PathBuf,
        /// The field (`abi`, `generation`, `kernels[2].head_dim`).
        field: String,
        /// What it holds.
        found: String,
        /// What was expected.
        expected: String,
    },
    /// A listed file's contents do not match its recorded hash.
    #[error("{}: sha256 {found} does not match the manifest's {expected} (field `{field}`): the file is corrupt or from another build", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The manifest field holding the hash.
        field: String,
        /// The file's hash.
        found: String,
        /// The recorded one.
        expected: String,
    },
}

/// Versions of the tools that built the artefacts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Toolchain {
    /// mlir-aie / IRON version.
    pub mlir_aie: String,
    /// Peano (llvm-aie) version.
    pub peano: String,
}

/// The recorded hashes of a kernel's files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Hashes {
    /// Of the `.xclbin`.
    pub xclbin: String,
    /// Of the instruction stream.
    pub instructions: String,
}

/// One compiled kernel.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KernelEntry {
    /// Its name (`attn_decode_d256_g4`).
    pub name: String,
    /// `decode` or `prefill`.
    pub phase: Phase,
    /// Head size.
    pub head_dim: usize,
    /// Query heads per kv head.
    pub group: usize,
    /// Query rows per tile (1 for decode, 32 for prefill).
    pub q_block: usize,
    /// Keys per block (128).
    pub kv_block: usize,
    /// The most positions one row may see.
    pub max_context: usize,
    /// The `.xclbin` file, relative to the manifest.
    pub xclbin: String,
    /// The kernel's IP_LAYOUT name in the xclbin.
    pub kernel: String,
    /// The instruction stream file (u32 words), relative to the manifest.
    pub instructions: String,
    /// Their sha256.
    pub sha256: Hashes,
}

/// A manifest as written by `shaders/npu/manifest.py`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The kernel ABI ([`ABI_VERSION`]).
    pub abi: u32,
    /// The NPU generation the kernels were built for.
    pub generation: String,
    /// The tools' versions.
    pub toolchain: Toolchain,
    /// The kernels.
    pub kernels: Vec<KernelEntry>,
}

/// A checked manifest and its directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Artefacts {
    /// The directory holding the manifest and the files.
    pub dir: PathBuf,
    /// The manifest.
    pub manifest: Manifest,
}

/// A kernel's files, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFiles {
    /// The `.xclbin` bytes.
    pub xclbin: Vec<u8>,
    /// The instruction stream.
    pub instructions: Vec<u32>,
}

/// The artefact directory: `option` (from `[backend.npu] artefacts`), else
/// `$TANDEM_NPU_ARTEFACTS`, else `~/.cache/tandem/npu/<generation>`.
pub fn locate(option: Option<&str>, generation: &str) -> Option<PathBuf> {
    if let Some(dir) = option {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os(ARTEFACTS_VAR).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(home.join("tandem").join("npu").join(generation))
}

impl Artefacts {
    /// Reads and checks `dir/manifest.json` for a device of `generation`.
    pub fn open(dir: &Path, generation: &str) -> Result<Artefacts, ArtefactError> {
        let path = dir.join(MANIFEST_FILE);
        if !path.exists() {
            return Err(ArtefactError::Missing { path });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ArtefactError::Read {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| ArtefactError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let field = |field: String, found: String, expected: String| ArtefactError::Field {
            path: path.clone(),
            field,
            found,
            expected,
        };
        if manifest.format != MANIFEST_FORMAT {
            return Err(field(
                "format".into(),
                manifest.format.to_string(),
                format!("this build reads format {MANIFEST_FORMAT}"),
            ));
        }
        if manifest.abi != ABI_VERSION {
            return Err(field(
                "abi".into(),
                manifest.abi.to_string(),
                format!("this build speaks kernel ABI {ABI_VERSION}: rebuild the artefacts from this tree's shaders/npu"),
            ));
        }
        if manifest.generation != generation {
            return Err(field(
                "generation".into(),
                format!("\"{}\"", manifest.generation),
                format!("the device is {generation}: kernels are built per generation"),
            ));
        }
        for (i, k) in manifest.kernels.iter().enumerate() {
            let q_block = match k.phase {
                Phase::Decode => 1,
                Phase::Prefill => PREFILL_Q_BLOCK,
            };
            if k.q_block != q_block {
                return Err(field(
                    format!("kernels[{i}].q_block"),
                    k.q_block.to_string(),
                    format!("the ABI's {} tile has {q_block} rows", k.phase.name()),
                ));
            }
            if k.kv_block != KV_BLOCK {
                return Err(field(
                    format!("kernels[{i}].kv_block"),
                    k.kv_block.to_string(),
                    format!("the ABI's key blocks hold {KV_BLOCK}"),
                ));
            }
            for (name, rel) in [("xclbin", &k.xclbin), ("instructions", &k.instructions)] {
                if Path::new(rel)
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(field(
                        format!("kernels[{i}].{name}"),
                        format!("\"{rel}\""),
                        "a file name inside the artefact directory".into(),
                    ));
                }
            }
        }
        Ok(Artefacts {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// The kernel for `phase` and `shape` that sees at least `context` positions.
    pub fn find(&self, phase: Phase, shape: KernelShape, context: usize) -> Option<(usize, &KernelEntry)> {
        self.manifest.kernels.iter().enumerate().find(|(_, k)| {
            k.phase == phase
                && k.head_dim == shape.head_dim
                && k.group == shape.group
                && k.max_context >= context
        })
    }

    /// What the manifest offers, for messages (`decode head_dim 256 group 4 ..32768`).
    pub fn offered(&self) -> String {
        let v: Vec<String> = self
            .manifest
            .kernels
            .iter()
            .map(|k| {
                format!(
                    "{} head_dim {} group {} ..{}",
                    k.phase.name(),
                    k.head_dim,
                    k.group,
                    k.max_context
                )
            })
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }

    /// Reads kernel `index`'s files and checks their hashes.
    pub fn load(&self, index: usize) -> Result<KernelFiles, ArtefactError> {
        let k = &self.manifest.kernels[index];
        let read = |rel: &str, field: &str, expected: &str| -> Result<Vec<u8>, ArtefactError> {
            let path = self.dir.join(rel);
            let bytes = std::fs::read(&path).map_err(|e| ArtefactError::Read {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let found = hex(&Sha256::digest(&bytes));
            if !found.eq_ignore_ascii_case(expected) {
                return Err(ArtefactError::Corrupt {
                    path,
                    field: format!("kernels[{index}].sha256.{field}"),
                    found,
                    expected: expected.to_string(),
                });
            }
            Ok(bytes)
        };
        let xclbin = read(&k.xclbin, "xclbin", &k.sha256.xclbin)?;
        let raw = read(&k.instructions, "instructions", &k.sha256.instructions)?;
        if raw.is_empty() || raw.len() % 4 != 0 {
            return Err(ArtefactError::Field {
                path: self.dir.join(&k.instructions),
                field: format!("kernels[{index}].instructions"),
                found: format!("{} bytes", raw.len()),
                expected: "a non-empty whole number of u32 words".into(),
            });
        }
        let instructions = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(KernelFiles { xclbin, instructions })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of `bytes` in lowercase hex, as the manifest records it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory under the system temp dir.
    pub fn temp_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "tandem-npu-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    /// Writes a manifest with one decode and one prefill kernel of `shape`, with the given
    /// files' bytes, and returns the directory.
    pub fn write_artefacts(
        tag: &str,
        generation: &str,
        shape: KernelShape,
        xclbin: &[u8],
        insts: &[u32],
    ) -> PathBuf {
        let dir = temp_dir(tag);
        let ib: Vec<u8> = insts.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(dir.join("k.xclbin"), xclbin).unwrap();
        std::fs::write(dir.join("k.insts.bin"), &ib).unwrap();
        let entry = |phase: &str, q: usize| {
            serde_json::json!({
                "name": format!("attn_{phase}"), "phase": phase, "head_dim": shape.head_dim,
                "group": shape.group, "q_block": q, "kv_block": 128, "max_context": 4096,
                "xclbin": "k.xclbin", "kernel": "MLIR_AIE", "instructions": "k.insts.bin",
                "sha256": { "xclbin": sha256_hex(xclbin), "instructions": sha256_hex(&ib) }
            })
        };
        let m = serde_json::json!({
            "format": 1, "abi": 1, "generation": generation,
            "toolchain": { "mlir_aie": "test", "peano": "test" },
            "kernels": [entry("decode", 1), entry("prefill", 32)]
        });
        std::fs::write(dir.join(MANIFEST_FILE), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
        dir
    }

    const SHAPE: KernelShape = KernelShape {
        head_dim: 256,
        group: 4,
    };

    #[test]
    fn a_good_manifest_loads_and_finds_its_kernels() {
        let dir = write_artefacts("good", "npu4", SHAPE, b"xclbin bytes", &[1, 2, 3]);
        let a = Artefacts::open(&dir, "npu4").unwrap();
        let (i, k) = a.find(Phase::Prefill, SHAPE, 100).unwrap();
        assert_eq!((i, k.q_block), (1, 32));
        assert!(a.find(Phase::Decode, SHAPE, 5000).is_none(), "beyond max_context");
        assert!(a
            .find(
                Phase::Decode,
                KernelShape {
                    head_dim: 128,
                    group: 2
                },
                1
            )
            .is_none());
        let files = a.load(0).unwrap();
        assert_eq!(files.instructions, vec![1, 2, 3]);
        assert!(a.offered().contains("decode head_dim 256 group 4 ..4096"));
    }

    #[test]
    fn bad_artefacts_are_refused_naming_file_and_field() {
        let dir = temp_dir("missing");
        let e = Artefacts::open(&dir, "npu4").unwrap_err().to_string();
        assert!(
            e.contains("manifest.json does not exist") && e.contains("build.sh"),
            "{e}"
        );

        let dir = write_artefacts("gen", "npu1", SHAPE, b"x", &[1]);
        let e = Artefacts::open(&dir, "npu4").unwrap_err().to_string();
        assert!(
            e.contains("field `generation` is \"npu1\"") && e.contains("device is npu4"),
            "{e}"
        );

        let m = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&m).unwrap();
        std::fs::write(&m, text.replace("\"abi\": 1", "\"abi\": 7")).unwrap();
        let e = Artefacts::open(&dir, "npu1").unwrap_err().to_string();
        assert!(e.contains("field `abi` is 7"), "{e}");
        std::fs::write(&m, text.replace("\"q_block\": 32", "\"q_block\": 16")).unwrap();
        let e = Artefacts::open(&dir, "npu1").unwrap_err().to_string();
        assert!(e.contains("kernels[1].q_block"), "{e}");
        std::fs::write(&m, text.replace("\"k.xclbin\"", "\"../k.xclbin\"")).unwrap();
        let e = Artefacts::open(&dir, "npu1").unwrap_err().to_string();
        assert!(e.contains("kernels[0].xclbin"), "{e}");
        std::fs::write(&m, "{\"format\": 1, \"abi\": 1}").unwrap();
        let e = Artefacts::open(&dir, "npu1").unwrap_err().to_string();
        assert!(e.contains("manifest.json") && e.contains("missing field"), "{e}");

        // A file changed after the manifest was written.
        std::fs::write(&m, &text).unwrap();
        std::fs::write(dir.join("k.insts.bin"), [9u8; 8]).unwrap();
        let a = Artefacts::open(&dir, "npu1").unwrap();
        let e = a.load(0).unwrap_err().to_string();
        assert!(
            e.contains("k.insts.bin") && e.contains("kernels[0].sha256.instructions"),
            "{e}"
        );
        std::fs::remove_file(dir.join("k.xclbin")).unwrap();
        let e = a.load(0).unwrap_err().to_string();
        assert!(e.contains("k.xclbin"), "{e}");
    }
}
