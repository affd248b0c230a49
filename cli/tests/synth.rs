//! `engine synth` writes GGUF files the engine loads and runs, in every dtype it offers.

mod common;

use common::Install;

#[test]
fn synthetic_models_load_and_generate_in_every_dtype() {
    let install = Install::new(&["cpu"]);
    for dtype in ["f16", "bf16", "q8_0", "q4_k"] {
        let out = install.path().join(format!("tiny-{dtype}.gguf"));
        let o = install.run(&[
            "synth",
            "--shape",
            "tiny",
            "--dtype",
            dtype,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{dtype}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = install.run(&[
            "run",
            "--model",
            out.to_str().unwrap(),
            "--tokens",
            "2,17,5",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--backend",
            "cpu",
            "--json",
        ]);
        assert!(
            r.status.success(),
            "{dtype}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(doc["prompt_tokens"], serde_json::json!([2, 17, 5]));
        assert!(
            doc["tokens"]
                .as_array()
                .is_some_and(|t| !t.is_empty() && t.len() <= 3),
            "{doc}"
        );
    }
}

#[test]
fn unknown_shape_and_dtype_are_named() {
    let install = Install::new(&["cpu"]);
    let out = install.path().join("x.gguf");
    let o = install.run(&["synth", "--shape", "gemma3-2b", "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("gemma3-2b") && err.contains("gemma3-270m"),
        "{err}"
    );
    let o = install.run(&[
        "synth",
        "--shape",
        "tiny",
        "--dtype",
        "q3_k",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("q3_k") && err.contains("q4_k"),
        "{err}"
    );
}

#[test]
fn an_existing_out_file_is_kept_unless_force_is_given() {
    let install = Install::new(&[]);
    let out = install.path().join("kept.gguf");
    std::fs::write(&out, "not a model, keep me").unwrap();
    let path = out.to_str().unwrap();
    let args = ["synth", "--shape", "tiny", "--dtype", "f16", "--out", path];
    let o = install.run(&args);
    let err = common::error_line(&args, &o);
    assert!(err.contains(path) && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "not a model, keep me");

    let o = install.run(&[&args[..], &["--force"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(&std::fs::read(&out).unwrap()[..4], b"GGUF");
}

/// `--mmproj` writes the shape's vision tower beside the model (tiny here), and a shape without
/// one is refused before anything is written.
#[test]
fn mmproj_files_are_written_for_shapes_with_a_vision_tower_only() {
    let install = Install::new(&["cpu"]);
    let (out, mm) = (
        install.path().join("t.gguf"),
        install.path().join("t-mmproj.gguf"),
    );
    let args = |shape: &str| {
        vec![
            "synth".to_string(),
            "--shape".into(),
            shape.into(),
            "--out".into(),
            out.to_str().unwrap().into(),
            "--mmproj".into(),
            mm.to_str().unwrap().into(),
            "--force".into(),
        ]
    };
    let run = |shape: &str| {
        let a = args(shape);
        install.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run("tiny");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::metadata(&mm).is_ok_and(|m| m.len() > 0));
    std::fs::remove_file(&out).unwrap();
    let o = run("gemma3-270m");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no vision tower"), "{err}");
    assert!(!out.exists(), "the model was written before the refusal");
}
