//! The default model: used when `--model` is left out, and refused with a clear error when its
//! checksum is wrong.

mod common;

use std::process::Command;

use common::Install;

#[test]
fn a_default_model_with_the_wrong_checksum_is_refused() {
    let install = Install::new(&["cpu"]);
    let cache = install.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let file = std::fs::File::create(cache.join("gemma-3-270m-q4_k_m.gguf")).unwrap();
    // The right size, the wrong bytes.
    file.set_len(tandem_engine::model::files::DEFAULT_MODEL_SIZE)
        .unwrap();
    drop(file);
    let out = Command::new(install.path().join("engine"))
        .args(["tokenize", "--prompt", "hi"])
        .env("TANDEM_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("gemma-3-270m-q4_k_m.gguf") && err.contains("SHA-256"),
        "{err}"
    );
    assert!(
        err.contains(tandem_engine::model::files::DEFAULT_MODEL_SHA256) && err.contains("fetch-model.sh"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn a_missing_default_model_says_how_to_get_it() {
    let install = Install::new(&["cpu"]);
    let out = Command::new(install.path().join("engine"))
        .args(["run", "--prompt", "hi", "--backend", "cpu"])
        .env("TANDEM_CACHE_DIR", install.path().join("empty"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not there") && err.contains("fetch-model.sh"),
        "{err}"
    );
}
