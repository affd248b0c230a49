//! Seeded sampling over the whole vocabulary repeats in `engine serve` on the real default
//! model: the same request with the same seed (temperature 0.8, top-k 0, top-p 1: every one of
//! the 262,144 tokens a candidate, where the tiniest change in a logit moves the draw) gives the
//! same tokens alone, inside a batch of six other streams whose prompts are being read while it
//! decodes, and after its prompt is found cached in a slot (prefix reuse). The CPU backend
//! chose its attention kernel by the step's row count, so a batched decode row was summed in
//! another order than alone and the text changed after a few dozen tokens.

mod common;
mod http;

use common::{default_model, Install};
use http::{post, Server};
use serde_json::{json, Value};

fn ids(addr: &str, doc: &Value) -> Vec<u64> {
    let r = post(addr, "/v1/completions", doc);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    v["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

#[test]
fn whole_vocabulary_sampling_with_a_seed_is_the_same_alone_batched_and_after_prefix_reuse() {
    let Some(model) = default_model() else {
        return;
    };
    let install = Install::new(&["cpu"]);
    // 16-token prompt chunks: the other prompts are read over several steps while the seeded
    // request decodes beside them.
    let server = Server::start(
        &install.path().join("engine"),
        &[
            "--model",
            model.to_str().expect("a UTF-8 path"),
            "--backend",
            "cpu",
            "--parallel",
            "8",
            "--chunk",
            "16",
        ],
    );
    let addr = server.addr.clone();
    let request = |prompt: &str, seed: u64| {
        json!({"prompt": prompt, "max_tokens": 96, "seed": seed, "temperature": 0.8,
               "top_k": 0, "top_p": 1.0})
    };
    // Longer than a chunk: a repeat keeps its first whole chunks (prefix reuse keeps whole
    // chunks, so the rest is read in the steps a fresh read takes).
    let prompt = "The history of the city begins in the year 1200, when the first settlers crossed \
                  the river from the east and built a small market beside the old stone bridge, where";
    let seeded = request(prompt, 7);
    let alone = ids(&addr, &seeded);
    assert_eq!(alone.len(), 96, "{alone:?}");
    let batched = std::thread::scope(|s| {
        let others: Vec<_> = (1..7u64)
            .map(|i| {
                let (addr, doc) = (
                    &addr,
                    request(&format!("Another prompt, number {i}, which talks about"), i),
                );
                s.spawn(move || ids(addr, &doc))
            })
            .collect();
        let mine = ids(&addr, &seeded);
        let others: Vec<Vec<u64>> = others.into_iter().map(|h| h.join().expect("client")).collect();
        // The batch was busy: six other streams, all different from the seeded one.
        assert!(others.iter().all(|o| !o.is_empty() && *o != alone));
        mine
    });
    assert_eq!(
        batched, alone,
        "the seeded request inside a batch differs from it alone"
    );
    // The slot now holds this prompt and its reply: the same request reuses the prefix.
    let again = ids(&addr, &seeded);
    assert!(server.metric("tandem_prompt_tokens_reused_total") > 0.0);
    assert_eq!(
        again, alone,
        "the seeded request after prefix reuse differs from it alone"
    );
    // Another seed draws another text (the comparisons above are not trivially true).
    assert_ne!(
        ids(
            &addr,
            &request("The history of the city begins in the year 1200, when", 8)
        ),
        alone
    );
}
