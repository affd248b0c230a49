//! Memory that matches its estimate: on the real default model, the peak resident memory of a
//! bounded run (`engine bench`'s `peak_rss_bytes`) is within 10% of what `engine placement` says
//! the process will hold (its `process_bytes`, measured before the weights, plus the CPU
//! unit's weights, KV cache and activations), at a small and a large prompt chunk. Before the
//! value slots and the released checkpoint pages, a 2048-row chunk peaked at 9.6 times its
//! estimate.

mod common;

use common::{default_model, Install};
use serde_json::Value;

fn json(install: &Install, args: &[&str]) -> Value {
    let out = install.run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn peak_memory_of_a_run_is_within_ten_percent_of_the_placement_estimate() {
    let Some(model) = default_model() else {
        return;
    };
    let install = Install::new(&["cpu"]);
    let model = model.to_str().expect("a UTF-8 path");
    for chunk in ["64", "1024"] {
        let common = [
            "--model",
            model,
            "--backend",
            "cpu",
            "--chunk",
            chunk,
            "--context",
            "2048",
        ];
        let placement = json(&install, &[&["placement", "--json"][..], &common].concat());
        let process = placement["process_bytes"]
            .as_u64()
            .expect("process_bytes measured");
        let units: u64 = placement["units"]
            .as_array()
            .expect("units")
            .iter()
            .filter(|u| u["host"] == true)
            .map(|u| {
                ["weight_bytes", "kv_cache_bytes", "activation_bytes"]
                    .iter()
                    .map(|k| u[*k].as_u64().expect(k))
                    .sum::<u64>()
            })
            .sum();
        let estimate = process + units;
        let bench = json(
            &install,
            &[
                &[
                    "bench",
                    "--json",
                    "--prompt-tokens",
                    "1024",
                    "--gen-tokens",
                    "2",
                    "--repeat",
                    "1",
                ][..],
                &common,
            ]
            .concat(),
        );
        let peak = bench["runs"][0]["peak_rss_bytes"]
            .as_u64()
            .or_else(|| bench["peak_rss_bytes"].as_u64())
            .unwrap_or_else(|| panic!("no peak_rss_bytes in {bench}"));
        let ratio = peak as f64 / estimate as f64;
        eprintln!("chunk {chunk}: peak RSS / estimate = {peak} / {estimate} = {ratio:.3}");
        assert!(
            (0.9..=1.1).contains(&ratio),
            "chunk {chunk}: peak RSS {peak} bytes against an estimate of {estimate} ({process} for the \
             process, {units} for the CPU unit): {ratio:.3}"
        );
    }
}
