//! Whether a checkpoint is made for chat: instruction-tuned, a base (pre-trained) checkpoint, or
//! without a chat template, as its metadata tells, with the key that decided it.
//!
//! A base checkpoint answers a chat turn by continuing the text (more questions, stray tokens),
//! which reads as if chat were broken; `engine chat` and `engine serve` say so once. The rule,
//! first decisive key wins:
//!
//! GGUF (llama.cpp's converter derives `general.finetune` and `general.name` from the
//! Hugging Face name: `gemma-3-1b-it` has finetune `it`, `gemma-3-1b-pt` has `pt`, and the base
//! `gemma-3-270m` has none):
//! 1. `tokenizer.chat_template` absent: no template.
//! 2. `general.finetune`: `pt`, `base`, `pretrained` mean base; any other value (`it`,
//!    `instruct`, a fine-tune's own name) means tuned.
//! 3. `general.name`, `general.basename`: a word `it`/`instruct`/`chat` means tuned, `pt`/`base`
//!    means base.
//! 4. `general.tags`: a tag `conversational`, `instruct`, `chat` or `it` means tuned.
//! 5. `tokenizer.ggml.eos_token_id` is `<end_of_turn>`: tuned (the `-it` checkpoints end their
//!    turns with it; the base ones declare `<eos>`).
//! 6. A name (`general.name`, else `general.basename`) that names Gemma without a suffix: base
//!    (Google names Gemma 3's base checkpoints `gemma-3-270m`, `gemma-3-1b-pt`, and the tuned
//!    ones always `-it`).
//!
//! `general.type` (`model` or `adapter`) says nothing about tuning and is not read.
//!
//! Hugging Face directory:
//! 1. No `chat_template` in `tokenizer_config.json`, no `chat_template.jinja` or
//!    `chat_template.json`: no template.
//! 2. `_name_or_path` of `config.json` (older transformers save it): as a GGUF name.
//! 3. `eos_token_id` of `generation_config.json`, then of `config.json`, listing
//!    `<end_of_turn>`: tuned (`[1, 106]` in the `-it` checkpoints).
//! 4. The directory's name, as a last resort: a `-it`/`-instruct`/`-chat` suffix means tuned,
//!    `-pt`/`-base` base.
//! 5. An `eos_token_id` (from 3) that does not list `<end_of_turn>`: base.
//!
//! Metadata that cannot be read or has an unexpected type is passed over here: the loader
//! reports it where it matters.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde_json::Value as Json;

use super::gguf::value::{GgufArray, GgufValue};

/// What the metadata says about chatting with the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuning {
    /// Instruction-tuned: made for chat.
    Instruct,
    /// A base (pre-trained) checkpoint: it continues text rather than answering.
    Base,
    /// No chat template: the conversation is rendered in Gemma's built-in turn format.
    NoTemplate,
    /// A template, and nothing that says which kind of checkpoint it is.
    Unknown,
}

/// The verdict and the metadata that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The verdict.
    pub tuning: Tuning,
    /// Where it was read: a GGUF key (`general.finetune`) or a file's field
    /// (`generation_config.json eos_token_id`); empty for [`Tuning::Unknown`].
    pub key: String,
    /// What was found there (`"pt"`, `absent`, `[1, 106]`).
    pub found: String,
}

impl Verdict {
    fn new(tuning: Tuning, key: impl Into<String>, found: impl Into<String>) -> Self {
        Verdict {
            tuning,
            key: key.into(),
            found: found.into(),
        }
    }

    fn unknown() -> Self {
        Verdict::new(Tuning::Unknown, "", "")
    }

    /// What a chat user should be told, once, when the model is a base checkpoint or has no
    /// template (`None` otherwise). It names the key that decided it.
    pub fn advice(&self) -> Option<String> {
        let why = match self.tuning {
            Tuning::Instruct | Tuning::Unknown => return None,
            Tuning::NoTemplate => format!("this model has no chat template ({self})"),
            Tuning::Base => format!("this model is a base checkpoint, not instruction-tuned ({self})"),
        };
        Some(format!(
            "{why}: chat uses Gemma's turn format, and the replies may wander (a base model \
             continues the text rather than answering); an instruction-tuned (-it) model answers"
        ))
    }
}

impl fmt::Display for Verdict {
    /// `` `general.finetune` = "pt" ``, `` `tokenizer.chat_template` is absent ``.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.starts_with("the ") {
            write!(f, "{}", self.key)?;
        } else {
            write!(f, "`{}`", self.key)?;
        }
        if self.found == ABSENT {
            write!(f, " is absent")
        } else {
            write!(f, " = {}", self.found)
        }
    }
}

const ABSENT: &str = "absent";

/// Where the metadata comes from.
#[derive(Clone, Copy)]
pub enum Metadata<'a> {
    /// A GGUF file's metadata.
    Gguf(&'a BTreeMap<String, GgufValue>),
    /// A Hugging Face model directory.
    HfDir(&'a Path),
}

/// What a model's metadata says about chat (the rule is in this module's documentation).
/// `has_template`: whether the tokenizer found a chat template; `end_of_turn`: the id of
/// `<end_of_turn>` in its vocabulary.
pub fn judge(metadata: Metadata<'_>, has_template: bool, end_of_turn: Option<u32>) -> Verdict {
    match metadata {
        Metadata::Gguf(m) => judge_gguf(m, has_template, end_of_turn),
        Metadata::HfDir(dir) => judge_hf(dir, has_template, end_of_turn),
    }
}

/// A word of a name that marks a tuned checkpoint, or a base one.
fn name_says(name: &str) -> Option<Tuning> {
    let words: Vec<String> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_lowercase)
        .collect();
    let has = |set: &[&str]| words.iter().any(|w| set.contains(&w.as_str()));
    if has(&["it", "instruct", "chat"]) {
        Some(Tuning::Instruct)
    } else if has(&["pt", "base", "pretrained"]) {
        Some(Tuning::Base)
    } else {
        None
    }
}

fn judge_gguf(m: &BTreeMap<String, GgufValue>, has_template: bool, end_of_turn: Option<u32>) -> Verdict {
    if !has_template {
        return Verdict::new(Tuning::NoTemplate, "tokenizer.chat_template", ABSENT);
    }
    let string = |key: &str| match m.get(key) {
        Some(GgufValue::String(s)) if !s.trim().is_empty() => Some(s.as_str()),
        _ => None,
    };
    if let Some(f) = string("general.finetune") {
        let tuning = match name_says(f) {
            Some(Tuning::Base) => Tuning::Base,
            _ => Tuning::Instruct,
        };
        return Verdict::new(tuning, "general.finetune", format!("{f:?}"));
    }
    for key in ["general.name", "general.basename"] {
        if let Some(t) = string(key).and_then(|n| name_says(n).map(|t| (n, t))) {
            return Verdict::new(t.1, key, format!("{:?}", t.0));
        }
    }
    if let Some(GgufValue::Array(GgufArray::String(tags))) = m.get("general.tags") {
        let tuned = ["conversational", "instruct", "chat", "it"];
        if let Some(tag) = tags
            .iter()
            .find(|t| tuned.contains(&t.to_ascii_lowercase().as_str()))
        {
            return Verdict::new(Tuning::Instruct, "general.tags", format!("[.., {tag:?}, ..]"));
        }
    }
    let eos = match m.get("tokenizer.ggml.eos_token_id") {
        Some(GgufValue::U32(id)) => Some(*id),
        Some(GgufValue::I32(id)) => u32::try_from(*id).ok(),
        _ => None,
    };
    if let Some(id) = eos.filter(|&id| Some(id) == end_of_turn) {
        return Verdict::new(
            Tuning::Instruct,
            "tokenizer.ggml.eos_token_id",
            format!("{id} (<end_of_turn>)"),
        );
    }
    for key in ["general.name", "general.basename"] {
        if let Some(n) = string(key) {
            if n.to_ascii_lowercase().contains("gemma") {
                return Verdict::new(Tuning::Base, key, format!("{n:?}, without -it"));
            }
            break;
        }
    }
    Verdict::unknown()
}

fn judge_hf(dir: &Path, has_template: bool, end_of_turn: Option<u32>) -> Verdict {
    if !has_template {
        return Verdict::new(Tuning::NoTemplate, "tokenizer_config.json chat_template", ABSENT);
    }
    let read = |file: &str| -> Option<Json> {
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        serde_json::from_str(&text).ok()
    };
    let config = read("config.json");
    let generation = read("generation_config.json");
    if let Some(name) = config
        .as_ref()
        .and_then(|c| c.get("_name_or_path"))
        .and_then(Json::as_str)
    {
        if let Some(t) = name_says(name) {
            return Verdict::new(t, "config.json _name_or_path", format!("{name:?}"));
        }
    }
    // The first file that declares its eos ids.
    let declared = [("generation_config.json", &generation), ("config.json", &config)]
        .into_iter()
        .find_map(|(file, doc)| {
            let v = doc.as_ref()?.get("eos_token_id")?;
            let ids: Vec<u64> = match v {
                Json::Number(n) => vec![n.as_u64()?],
                Json::Array(a) => a.iter().filter_map(Json::as_u64).collect(),
                _ => return None,
            };
            Some((format!("{file} eos_token_id"), v.to_string(), ids))
        });
    if let Some((key, found, ids)) = &declared {
        if end_of_turn.is_some_and(|e| ids.contains(&u64::from(e))) {
            return Verdict::new(Tuning::Instruct, key, format!("{found} (lists <end_of_turn>)"));
        }
    }
    let dir_name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
    if let Some(name) = dir_name {
        let lower = name.to_ascii_lowercase();
        let suffix = lower.rsplit(['-', '_']).next().unwrap_or_default();
        let tuning = match suffix {
            "it" | "instruct" | "chat" => Some(Tuning::Instruct),
            "pt" | "base" => Some(Tuning::Base),
            _ => None,
        };
        if let Some(t) = tuning.filter(|_| lower.len() > suffix.len()) {
            return Verdict::new(t, "the directory's name", format!("{name:?}"));
        }
    }
    if let Some((key, found, _)) = declared {
        return Verdict::new(Tuning::Base, key, format!("{found} (no <end_of_turn>)"));
    }
    Verdict::unknown()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOT: Option<u32> = Some(106);

    fn gguf(entries: &[(&str, GgufValue)]) -> BTreeMap<String, GgufValue> {
        entries.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    fn s(v: &str) -> GgufValue {
        GgufValue::String(v.into())
    }

    fn judge_gguf_of(entries: &[(&str, GgufValue)], has_template: bool) -> Verdict {
        judge(Metadata::Gguf(&gguf(entries)), has_template, EOT)
    }

    #[test]
    fn gguf_without_a_template_says_so_whatever_the_name() {
        let v = judge_gguf_of(&[("general.finetune", s("it"))], false);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::NoTemplate, "tokenizer.chat_template")
        );
        assert_eq!(v.to_string(), "`tokenizer.chat_template` is absent");
        assert!(v
            .advice()
            .is_some_and(|a| a.contains("`tokenizer.chat_template` is absent")));
    }

    #[test]
    fn gguf_finetune_decides_gemma_3_base_and_it() {
        let it = judge_gguf_of(
            &[
                ("general.finetune", s("it")),
                ("general.name", s("Gemma 3 1b Pt")),
            ],
            true,
        );
        assert_eq!(
            (it.tuning, it.key.as_str()),
            (Tuning::Instruct, "general.finetune")
        );
        assert_eq!(it.advice(), None);
        let pt = judge_gguf_of(&[("general.finetune", s("pt"))], true);
        assert_eq!(
            (pt.tuning, pt.to_string().as_str()),
            (Tuning::Base, "`general.finetune` = \"pt\"")
        );
        assert!(pt
            .advice()
            .is_some_and(|a| a.contains("base checkpoint") && a.contains("general.finetune")));
        // A fine-tune's own name is a fine-tune.
        let own = judge_gguf_of(&[("general.finetune", s("medical-qa"))], true);
        assert_eq!(own.tuning, Tuning::Instruct);
    }

    #[test]
    fn gguf_name_basename_tags_and_eos_decide_in_order() {
        let named = judge_gguf_of(&[("general.name", s("Gemma-3-270M-It"))], true);
        assert_eq!(
            (named.tuning, named.key.as_str()),
            (Tuning::Instruct, "general.name")
        );
        let base = judge_gguf_of(&[("general.basename", s("gemma-3-base"))], true);
        assert_eq!(
            (base.tuning, base.key.as_str()),
            (Tuning::Base, "general.basename")
        );
        let tags = GgufValue::Array(GgufArray::String(vec!["gemma3".into(), "conversational".into()]));
        let tagged = judge_gguf_of(
            &[("general.name", s("Gemma 3 270m")), ("general.tags", tags)],
            true,
        );
        assert_eq!(
            (tagged.tuning, tagged.key.as_str()),
            (Tuning::Instruct, "general.tags")
        );
        let eos = judge_gguf_of(
            &[
                ("general.name", s("Gemma 3 270m")),
                ("tokenizer.ggml.eos_token_id", GgufValue::U32(106)),
            ],
            true,
        );
        assert_eq!(
            (eos.tuning, eos.key.as_str()),
            (Tuning::Instruct, "tokenizer.ggml.eos_token_id")
        );
        // The default model's metadata (Google's base Gemma 3 270M as llama.cpp converts it), had
        // it a template: a Gemma name without a suffix, <eos> as EOS.
        let default_tags = ["gemma3", "gemma", "google", "text-generation"].map(String::from);
        let plain = judge_gguf_of(
            &[
                ("general.type", s("model")),
                ("general.name", s("Gemma 3 270m")),
                ("general.basename", s("gemma-3")),
                ("general.size_label", s("270M")),
                (
                    "general.tags",
                    GgufValue::Array(GgufArray::String(default_tags.to_vec())),
                ),
                ("tokenizer.ggml.eos_token_id", GgufValue::U32(1)),
            ],
            true,
        );
        assert_eq!((plain.tuning, plain.key.as_str()), (Tuning::Base, "general.name"));
        // Nothing to go on: no verdict, no advice.
        let other = judge_gguf_of(
            &[("general.name", s("MyBot")), ("general.type", s("model"))],
            true,
        );
        assert_eq!(other.tuning, Tuning::Unknown);
        assert_eq!(other.advice(), None);
    }

    /// The default model where it is (CI fetches it): no template decides; without that rule
    /// its name would.
    #[test]
    fn the_default_gguf_has_no_template_and_a_base_name() {
        let Ok(path) = crate::model::files::default_model() else {
            assert!(std::env::var_os("CI").is_none(), "CI fetches the default model");
            return;
        };
        let file = crate::checkpoint::gguf::GgufFile::open(&path).unwrap();
        let tokenizer = crate::tokenizer::gguf::from_gguf(&file).unwrap();
        let eot = tokenizer.token_id("<end_of_turn>");
        let v = judge(
            Metadata::Gguf(file.metadata()),
            tokenizer.chat_template().is_some(),
            eot,
        );
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::NoTemplate, "tokenizer.chat_template")
        );
        let v = judge(Metadata::Gguf(file.metadata()), true, eot);
        assert_eq!(
            (v.tuning, v.to_string().as_str()),
            (Tuning::Base, "`general.name` = \"Gemma 3 270m\", without -it")
        );
    }

    /// The instruction-tuned chat fixture (tests/fixtures/chat): its eos ids list <end_of_turn>.
    #[test]
    fn the_chat_fixture_is_instruction_tuned_by_its_eos_ids() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/gemma3-tiny-it");
        let tokenizer = crate::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let eot = tokenizer.token_id("<end_of_turn>");
        let v = judge(Metadata::HfDir(&dir), tokenizer.chat_template().is_some(), eot);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::Instruct, "generation_config.json eos_token_id")
        );
        assert_eq!(v.advice(), None);
    }

    fn hf_dir(name: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        (tmp, dir)
    }

    #[test]
    fn hf_without_a_template_says_so() {
        let (_t, dir) = hf_dir("gemma-3-1b-it", &[]);
        let v = judge(Metadata::HfDir(&dir), false, EOT);
        assert_eq!(v.tuning, Tuning::NoTemplate);
        assert!(
            v.to_string().starts_with("`tokenizer_config.json chat_template"),
            "{v}"
        );
    }

    #[test]
    fn hf_eos_ids_decide_gemma_3_it_and_pt() {
        let it_gen = r#"{"bos_token_id": 2, "eos_token_id": [1, 106]}"#;
        let (_t, dir) = hf_dir("model", &[("generation_config.json", it_gen)]);
        let v = judge(Metadata::HfDir(&dir), true, EOT);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::Instruct, "generation_config.json eos_token_id")
        );
        // The published -pt checkpoints declare <eos> alone.
        let (_t, dir) = hf_dir("model", &[("config.json", r#"{"eos_token_id": 1}"#)]);
        let v = judge(Metadata::HfDir(&dir), true, EOT);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::Base, "config.json eos_token_id")
        );
        assert!(v
            .advice()
            .is_some_and(|a| a.contains("`config.json eos_token_id` = 1")));
    }

    #[test]
    fn hf_name_or_path_comes_first_and_the_directory_name_last() {
        let cfg = r#"{"_name_or_path": "google/gemma-3-1b-pt", "eos_token_id": [1, 106]}"#;
        let (_t, dir) = hf_dir("x", &[("config.json", cfg)]);
        let v = judge(Metadata::HfDir(&dir), true, EOT);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::Base, "config.json _name_or_path")
        );
        // A -it directory whose files declare <eos> alone: the name, before the eos ids.
        let (_t, dir) = hf_dir(
            "gemma-3-270m-it",
            &[("generation_config.json", r#"{"eos_token_id": 1}"#)],
        );
        let v = judge(Metadata::HfDir(&dir), true, EOT);
        assert_eq!(
            (v.tuning, v.key.as_str()),
            (Tuning::Instruct, "the directory's name")
        );
        let (_t, dir) = hf_dir("gemma-3-4b-pt", &[]);
        assert_eq!(judge(Metadata::HfDir(&dir), true, EOT).tuning, Tuning::Base);
        // Unreadable files are passed over; no eos ids and a plain name: no verdict.
        let (_t, dir) = hf_dir("tiny", &[("config.json", "{not json")]);
        assert_eq!(judge(Metadata::HfDir(&dir), true, EOT).tuning, Tuning::Unknown);
    }
}
