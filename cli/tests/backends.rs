//! `engine backends` end to end: plugins found next to the binary, their status, bad input.

mod common;

use common::Install;

#[test]
fn lists_cpu_available_and_the_others_with_a_reason() {
    // Not the GPU backends: whether they are available (and their device names) depends on the
    // machine; json_output_reports_each_backend and gpu_run.rs cover them.
    let install = Install::new(&["cpu", "npu", "npu_emu"]);
    let out = install.run(&["backends"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = install.stdout(&out);
    // The CPU line's thread count and kernel set depend on the machine.
    let text = normalize_cpu_line(&text);
    insta::assert_snapshot!(text);
}

/// `threads=<n>` becomes `threads=N`, `kernels=<set>` `kernels=SET` (after checking that the
/// set is one the CPU backend names), `precision=<exact|fast>` `precision=P` (fast where the CPU
/// has the 8-bit products) and `decode_threads=<spin|pool>` `decode_threads=POOL`.
fn normalize_cpu_line(s: &str) -> String {
    s.lines()
        .map(|l| {
            let mut l = l.to_string();
            for (key, with) in [
                ("threads=", "N"),
                ("kernels=", "SET"),
                ("precision=", "P"),
                ("decode_threads=", "POOL"),
            ] {
                if let Some(i) = l.find(key) {
                    let v = i + key.len();
                    let end = l[v..]
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .map_or(l.len(), |e| v + e);
                    if key == "decode_threads=" {
                        assert!(
                            ["spin", "pool"].contains(&&l[v..end]),
                            "unknown decode threads in {l}"
                        );
                    }
                    if key == "precision=" {
                        assert!(
                            ["exact", "fast"].contains(&&l[v..end]),
                            "unknown precision in {l}"
                        );
                    }
                    if key == "kernels=" {
                        assert!(
                            ["amx", "avx512_vnni", "avx512", "avx2", "scalar"].contains(&&l[v..end]),
                            "unknown kernel set in {l}"
                        );
                    }
                    l = format!("{}{key}{with}{}", &l[..i], &l[end..]);
                }
            }
            l
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn json_output_reports_each_backend() {
    let install = Install::new(&["cpu", "vulkan", "wgpu"]);
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let backends = doc["backends"].as_array().expect("backends array");
    let cpu = backends.iter().find(|b| b["name"] == "cpu").expect("cpu listed");
    assert_eq!(cpu["available"], true);
    assert_eq!(cpu["info"]["kind"], "cpu");
    let vk = backends
        .iter()
        .find(|b| b["name"] == "vulkan")
        .expect("vulkan listed");
    // Available where a Vulkan device is (lavapipe in CI), else unavailable with a reason.
    if vk["available"] == true {
        assert_eq!(vk["info"]["name"], "vulkan", "{vk}");
        // The product path prefill takes: lavapipe has no cooperative matrices.
        let features = vk["info"]["features"].to_string();
        assert!(features.contains("\"prefill="), "{vk}");
        if std::env::var_os("CI").is_some() {
            assert!(features.contains("\"prefill=scalar\""), "{vk}");
        }
    } else {
        assert_eq!(vk["available"], false, "{vk}");
        assert!(
            vk["reason"].as_str().is_some_and(|r| r.contains("Vulkan")),
            "{vk}"
        );
    }
    // wgpu: available on any adapter (lavapipe in CI, listed with its API and limits), else
    // unavailable naming what it found.
    let wgpu = backends
        .iter()
        .find(|b| b["name"] == "wgpu")
        .expect("wgpu listed");
    if wgpu["available"] == true {
        let features = wgpu["info"]["features"].to_string();
        assert!(features.contains("max_storage_binding="), "{wgpu}");
        // The kernel variants the adapter gets: lavapipe offers subgroups and f16, and packed
        // integer dot products that are not accelerated, which `auto` leaves off.
        assert!(features.contains("kernels="), "{wgpu}");
        if std::env::var_os("CI").is_some() {
            assert!(features.contains("kernels=subgroups+f16\""), "{wgpu}");
            assert!(features.contains("int8_dot(not accelerated, off)"), "{wgpu}");
            assert!(features.contains("\"prefill=tiled_f16\""), "{wgpu}");
        }
        // The same physical device through both APIs (lavapipe in CI) is named alike: what a
        // budget on one device binds.
        if vk["available"] == true {
            let (a, b) = (&vk["info"]["physical_device"], &wgpu["info"]["physical_device"]);
            assert!(a.as_str().is_some_and(|s| s.len() == 32), "{vk}");
            if std::env::var_os("CI").is_some() {
                assert_eq!(a, b, "vulkan and wgpu on lavapipe: {vk} {wgpu}");
            }
        }
        assert!(cpu["info"].get("physical_device").is_none(), "{cpu}");
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run wgpu (lavapipe): {wgpu}"
        );
        assert!(
            wgpu["reason"].as_str().is_some_and(|r| r.contains("adapter")),
            "{wgpu}"
        );
    }
}

#[test]
fn a_missing_plugin_directory_and_a_broken_plugin_are_reported() {
    let install = Install::new(&["cpu"]);
    std::fs::write(
        install.path().join(format!(
            "{}tandem_backend_broken{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        )),
        b"junk",
    )
    .unwrap();
    let out = install.run(&["backends", "--plugin-dir", "/nonexistent/plugins"]);
    assert!(out.status.success());
    let text = install.stdout(&out);
    assert!(text.contains("plugin directory /nonexistent/plugins"), "{text}");
    assert!(
        text.contains("libtandem_backend_broken") && text.contains("cannot load the library"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("cpu") && l.contains("available")),
        "{text}"
    );
}

#[test]
fn bad_config_names_file_and_field() {
    let install = Install::new(&["cpu"]);
    let cfg = install.path().join("tandem.toml");
    std::fs::write(&cfg, "[placement]\nattn = [\"cpu\"]\n").unwrap();
    let out = install.run(&["--config", cfg.to_str().unwrap(), "backends"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tandem.toml") && err.contains("attn"), "{err}");
    assert_eq!(err.lines().count(), err.lines().filter(|l| !l.is_empty()).count());
}

#[test]
fn backend_options_from_the_config_reach_the_plugin() {
    let install = Install::new(&["cpu"]);
    let cfg = install.path().join("tandem.toml");
    std::fs::write(&cfg, "[backend.cpu]\nthreads = 0\n").unwrap();
    let out = install.run(&["--config", cfg.to_str().unwrap(), "backends"]);
    let text = install.stdout(&out);
    assert!(text.contains("'threads' must be at least 1"), "{text}");
    // Not a number: the option and the value named.
    std::fs::write(&cfg, "[backend.cpu]\nthreads = \"many\"\n").unwrap();
    let out = install.run(&["--config", cfg.to_str().unwrap(), "backends"]);
    let text = install.stdout(&out);
    assert!(text.contains("'threads'") && text.contains("'many'"), "{text}");
    // More threads than any host has cores: clamped to the host's, and said.
    std::fs::write(&cfg, "[backend.cpu]\nthreads = 100000\n").unwrap();
    let out = install.run(&["--config", cfg.to_str().unwrap(), "backends"]);
    let text = install.stdout(&out);
    assert!(text.contains("(of 100000 asked: the host's cores)"), "{text}");
}

#[test]
fn npu_is_unavailable_with_the_reason_and_its_emulator_available() {
    let install = Install::new(&["cpu", "npu", "npu_emu"]);
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let backends = doc["backends"].as_array().expect("backends array");
    let get = |name: &str| {
        backends
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {doc}"))
    };
    // No machine here has an NPU: the reason says what is missing.
    let npu = get("npu");
    assert_eq!(npu["available"], false, "{npu}");
    let reason = npu["reason"].as_str().expect("a reason");
    assert!(reason.contains("NPU") || reason.contains("amdxdna"), "{reason}");
    let emu = get("npu-emu");
    assert_eq!(emu["available"], true, "{emu}");
    assert_eq!(emu["info"]["kind"], "npu");
    assert!(
        emu["info"]["device"]
            .as_str()
            .is_some_and(|d| d.contains("emulated")),
        "{emu}"
    );
}

/// A fake sysfs tree holding a bound Strix NPU (npu4), for `[backend.npu] root`.
fn fake_npu4(root: &std::path::Path) {
    let w = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let d = "sys/bus/pci/devices/0000:c6:00.1";
    w(&format!("{d}/vendor"), "0x1022\n");
    w(&format!("{d}/device"), "0x17f0\n");
    w(&format!("{d}/revision"), "0x10\n");
    w(&format!("{d}/vbnv"), "RyzenAI-npu4\n");
    w(&format!("{d}/fw_version"), "1.0.0.166\n");
    w("proc/sys/kernel/osrelease", "6.14.0\n");
    w("dev/accel/accel0", "");
    std::fs::create_dir_all(root.join("sys/module/amdxdna")).unwrap();
    std::fs::create_dir_all(root.join("sys/bus/pci/drivers/amdxdna")).unwrap();
    std::fs::create_dir_all(root.join("sys/class/accel/accel0")).unwrap();
    std::os::unix::fs::symlink("../../../../bus/pci/drivers/amdxdna", root.join(d).join("driver")).unwrap();
    std::os::unix::fs::symlink(
        "../../../bus/pci/devices/0000:c6:00.1",
        root.join("sys/class/accel/accel0/device"),
    )
    .unwrap();
}

#[test]
fn a_detected_npu_without_usable_artefacts_says_which_and_why() {
    let install = Install::new(&["npu"]);
    let root = install.path().join("root");
    fake_npu4(&root);
    let arts = install.path().join("artefacts");
    std::fs::create_dir_all(&arts).unwrap();
    let cfg = install.path().join("tandem.toml");
    let reason = |cfg_text: String| {
        std::fs::write(&cfg, cfg_text).unwrap();
        let out = install.run(&["--config", cfg.to_str().unwrap(), "backends", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
        let npu = &doc["backends"][0];
        assert_eq!(npu["available"], false, "{npu}");
        npu["reason"].as_str().unwrap_or_default().to_string()
    };
    let table = format!(
        "[backend.npu]\nroot = \"{}\"\nartefacts = \"{}\"\n",
        root.display(),
        arts.display()
    );
    // Found, but no manifest.
    let r = reason(table.clone());
    assert!(
        r.contains("NPU npu4 found") && r.contains("manifest.json does not exist"),
        "{r}"
    );
    // A manifest built for Phoenix on a Strix NPU.
    std::fs::write(
        arts.join("manifest.json"),
        r#"{"format": 1, "abi": 1, "generation": "npu1", "toolchain": {"mlir_aie": "x", "peano": "x"}, "kernels": []}"#,
    )
    .unwrap();
    let r = reason(table.clone());
    assert!(
        r.contains("field `generation` is \"npu1\"") && r.contains("device is npu4"),
        "{r}"
    );
    // Good artefacts, but the node is not a device (the fake tree's is a plain file).
    std::fs::write(
        arts.join("manifest.json"),
        r#"{"format": 1, "abi": 1, "generation": "npu4", "toolchain": {"mlir_aie": "x", "peano": "x"}, "kernels": []}"#,
    )
    .unwrap();
    let r = reason(table);
    assert!(r.contains("accel0"), "{r}");
    // No tree at all: no device.
    let r = reason(format!(
        "[backend.npu]\nroot = \"{}\"\n",
        install.path().join("empty").display()
    ));
    assert!(r.contains("no AMD NPU found"), "{r}");
}

/// A memory budget belongs to the device: with `[backend.vulkan] memory_limit` set, a placement
/// on wgpu, which drives the same GPU (lavapipe in CI), is held to that limit and the error says
/// whose limit it is; and units of one placement on one device share its budget, which `engine
/// placement` says. Needs both GPU backends on one physical device (CI: lavapipe); elsewhere it
/// checks nothing more than that they are not.
#[test]
fn a_memory_limit_binds_every_backend_on_its_device() {
    let install = Install::new(&["cpu", "vulkan", "wgpu"]);
    let device = |name: &str| {
        common::backend_listing(&install, name)["info"]["physical_device"]
            .as_str()
            .map(str::to_string)
    };
    let (vk, wgpu) = (device("vulkan"), device("wgpu"));
    if vk.is_none() || vk != wgpu {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs vulkan and wgpu on one lavapipe device: {vk:?} {wgpu:?}"
        );
        return;
    }
    let model = common::fixture("text-published");
    let model = model.to_str().expect("UTF-8 path");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("limit.toml");
    std::fs::write(&config, "[backend.vulkan]\nmemory_limit = \"16MiB\"\n").expect("config");
    let config = config.to_str().expect("UTF-8 path");
    let args = [
        "--config",
        config,
        "placement",
        "--model",
        model,
        "--backend",
        "wgpu",
    ];
    // (A note that wgpu runs on a software GPU may come first.)
    let line = common::error_line_after_notes(&args, &install.run(&args));
    for want in [
        "does not fit wgpu",
        "[backend.vulkan] memory_limit = \"16MiB\", which binds wgpu too",
    ] {
        assert!(line.contains(want), "{want:?} not in: {line}");
    }
    // No limit: attention on vulkan, the rest on wgpu, one device and one budget between them.
    let out = install.run(&["placement", "--model", model, "--backend", "vulkan+wgpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = install.stdout(&out);
    assert!(
        text.contains("shares its device and its budget with wgpu"),
        "{text}"
    );
    assert!(
        text.contains("shares its device and its budget with vulkan"),
        "{text}"
    );
}

/// A second instance takes its own `[backend."vulkan#2"]` table over `[backend.vulkan]` (the
/// way to put it on a second GPU): here its `memory_limit`, which a layer split across the two
/// instances then meets, and the error names that table. On lavapipe both instances drive one
/// device, so the first instance is held to the second's smaller budget too.
#[test]
fn a_second_instance_takes_its_own_options() {
    let install = Install::new(&["cpu", "vulkan"]);
    if !common::gpu_available(&install, "vulkan") {
        return;
    }
    let model = common::fixture("text-published");
    let model = model.to_str().expect("UTF-8 path");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("two.toml");
    std::fs::write(
        &config,
        "[backend.\"vulkan#2\"]\nmemory_limit = \"16MiB\"\n[placement.layers]\nvulkan = \"0-2\"\n\"vulkan#2\" = \"3-5\"\n",
    )
    .expect("config");
    let config = config.to_str().expect("UTF-8 path");
    let args = [
        "--config",
        config,
        "placement",
        "--model",
        model,
        "--backend",
        "auto",
    ];
    let line = common::error_line_after_notes(&args, &install.run(&args));
    assert!(
        line.contains("[backend.\"vulkan#2\"] memory_limit = \"16MiB\""),
        "{line}"
    );
}
