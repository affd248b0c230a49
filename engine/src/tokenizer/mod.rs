//! Text <-> token ids for a model directory, plus the facts generation needs from the tokenizer
//! files: BOS, the stop ids and the chat template.
//!
//! Two implementations sit behind the private `Implementation` enum: a Hugging Face
//! `tokenizer.json` (through the `tokenizers` crate, read here) and a SentencePiece vocabulary from
//! GGUF metadata ([`gguf`], [`spm`]). Chat templates are in [`chat`].
//!
//! Files read by [`Tokenizer::from_dir`]:
//! - `tokenizer.json` (required): vocabulary, normaliser, pre-tokeniser, post-processor, decoder.
//! - `tokenizer_config.json` (optional): `bos_token`, `eos_token`, `add_bos_token`,
//!   `chat_template`.
//! - `chat_template.jinja` / `chat_template.json` (optional): the chat template when
//!   `tokenizer_config.json` has none (newer `transformers` versions save it there).
//! - `generation_config.json` (optional): `eos_token_id` (an id or a list), `bos_token_id`.

pub mod chat;
pub mod gguf;
pub mod spm;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

/// Errors from loading tokenizer files, encoding or decoding.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file is malformed.
    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// `tokenizer.json` is malformed, or not a tokenizer the `tokenizers` crate accepts.
    #[error("cannot load tokenizer from {}: {message}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// What the `tokenizers` crate reported.
        message: String,
    },
    /// A field of a configuration file has an unexpected type or value.
    #[error("{}: field `{field}`: {message}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field, as a JSON path (`eos_token_id`, `chat_template[1].name`).
        field: String,
        /// What was wrong and what was expected.
        message: String,
    },
    /// Encoding text failed inside the tokenizer implementation.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding ids failed inside the tokenizer implementation.
    #[error("cannot decode token ids: {0}")]
    Decode(String),
    /// A GGUF file's tokenizer metadata is unreadable.
    #[error(transparent)]
    Gguf(#[from] crate::checkpoint::gguf::GgufError),
    /// A GGUF file's tokenizer metadata describes no tokenizer tandem can build.
    #[error("{}: {message}", path.display())]
    GgufMetadata {
        /// The file.
        path: PathBuf,
        /// The metadata key and what is wrong with it.
        message: String,
    },
    /// The model directory has no `tokenizer.json`: only token ids can be used.
    #[error("{} has no tokenizer.json: text cannot be encoded or decoded; give token ids instead (--tokens, or a prompt of ids)", dir.display())]
    NoVocabulary {
        /// The model directory.
        dir: PathBuf,
    },
    /// A token id that the vocabulary does not contain.
    #[error("token id {id} is not in the vocabulary (vocabulary size {vocab_size})")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// [`Tokenizer::vocab_size`].
        vocab_size: usize,
    },
}

/// The implementations a [`Tokenizer`] can wrap. Add a variant (and its arms below) for a new
/// source of tokenizers; nothing outside this module sees it.
enum Implementation {
    /// A Hugging Face `tokenizer.json`.
    HuggingFace(Box<tokenizers::Tokenizer>),
    /// A SentencePiece vocabulary from GGUF metadata.
    SentencePiece(Box<spm::SpmTokenizer>),
    /// No vocabulary: a model directory without `tokenizer.json` (the directory).
    Absent(PathBuf),
}

impl Implementation {
    /// Encodes `text`; returns the ids and whether the first id was added by the post-processor
    /// (rather than coming from the text).
    fn encode(&self, text: &str, add_special: bool) -> Result<(Vec<u32>, bool), TokenizerError> {
        match self {
            Implementation::HuggingFace(tok) => {
                let enc = tok
                    .encode(text, add_special)
                    .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                let first_is_added = enc.get_special_tokens_mask().first() == Some(&1);
                Ok((enc.get_ids().to_vec(), first_is_added))
            }
            Implementation::SentencePiece(spm) => {
                let add_bos = add_special && spm.add_bos() && spm.bos().is_some();
                Ok((spm.encode(text, add_bos), add_bos))
            }
            Implementation::Absent(dir) => Err(TokenizerError::NoVocabulary { dir: dir.clone() }),
        }
    }

    /// Decodes ids that are known to be in the vocabulary.
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        match self {
            Implementation::HuggingFace(tok) => tok
                .decode(ids, skip_special)
                .map_err(|e| TokenizerError::Decode(e.to_string())),
            Implementation::SentencePiece(spm) => spm
                .decode(ids, skip_special)
                .map_err(|e| TokenizerError::Decode(e.to_string())),
            Implementation::Absent(dir) => Err(TokenizerError::NoVocabulary { dir: dir.clone() }),
        }
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        match self {
            Implementation::HuggingFace(tok) => tok.token_to_id(token),
            Implementation::SentencePiece(spm) => spm.id_of(token),
            Implementation::Absent(_) => None,
        }
    }

    fn has_id(&self, id: u32) -> bool {
        match self {
            Implementation::HuggingFace(tok) => tok.id_to_token(id).is_some(),
            Implementation::SentencePiece(spm) => (id as usize) < spm.vocab_size(),
            Implementation::Absent(_) => false,
        }
    }

    fn token(&self, id: u32) -> Option<String> {
        match self {
            Implementation::HuggingFace(tok) => tok.id_to_token(id),
            Implementation::SentencePiece(spm) => spm.token_to_piece(id).map(str::to_owned),
            Implementation::Absent(_) => None,
        }
    }

    /// The bytes token `id` stands for; see [`Tokenizer::token_bytes`].
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match self {
            Implementation::HuggingFace(tok) => {
                let piece = tok.id_to_token(id)?;
                if let Some(byte) = spm::byte_token_value(&piece) {
                    return Some(vec![byte]);
                }
                tok.decode(&[id], false).ok().map(String::into_bytes)
            }
            Implementation::SentencePiece(spm) => spm.token_bytes(id),
            Implementation::Absent(_) => None,
        }
    }

    /// One more than the largest id, added tokens included.
    fn vocab_size(&self) -> usize {
        match self {
            Implementation::HuggingFace(tok) => tok
                .get_vocab(true)
                .values()
                .max()
                .map_or(0, |&max| max as usize + 1),
            Implementation::SentencePiece(spm) => spm.vocab_size(),
            Implementation::Absent(_) => 0,
        }
    }
}

/// A special token: its text and id.
#[derive(Debug, Clone)]
struct Special {
    text: String,
    id: u32,
}

/// A model's tokenizer and the generation facts that come with it (BOS, stop ids, chat template).
pub struct Tokenizer {
    inner: Implementation,
    vocab_size: usize,
    bos: Option<Special>,
    eos: Option<Special>,
    add_bos_token: Option<bool>,
    stop_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos_token", &self.add_bos_token)
            .field("stop_ids", &self.stop_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

/// The token that marks the end of a chat turn in Gemma's format.
const END_OF_TURN: &str = "<end_of_turn>";

impl Tokenizer {
    /// Loads the tokenizer of a Hugging Face model directory: `tokenizer.json` (required),
    /// `tokenizer_config.json` and `generation_config.json` (optional), and a chat template from
    /// `tokenizer_config.json`, `chat_template.jinja` or `chat_template.json` (optional).
    ///
    /// Without `tokenizer.json` the tokenizer has no vocabulary ([`Tokenizer::has_vocabulary`]):
    /// token ids still run, and the stop ids come from `generation_config.json`; encoding and
    /// decoding text fail with [`TokenizerError::NoVocabulary`].
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.exists() {
            return Self::without_vocabulary(dir);
        }
        let text = read_to_string(&tok_path)?;
        let hf: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: tok_path.clone(),
                    message: e.to_string(),
                })?;
        drop(text);
        let inner = Implementation::HuggingFace(Box::new(hf));
        let vocab_size = inner.vocab_size();

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_optional_json(&cfg_path)?;
        let gen_path = dir.join("generation_config.json");
        let gen = read_optional_json(&gen_path)?;

        let special = |field: &str| -> Result<Option<Special>, TokenizerError> {
            let Some(cfg) = &cfg else { return Ok(None) };
            let Some(text) = token_field(&cfg_path, cfg, field)? else {
                return Ok(None);
            };
            let id = inner.token_id(&text).ok_or_else(|| TokenizerError::Field {
                path: cfg_path.clone(),
                field: field.to_owned(),
                message: format!("token {text:?} is not in the vocabulary of tokenizer.json"),
            })?;
            Ok(Some(Special { text, id }))
        };
        let from_id = |ids: Vec<u32>| -> Option<Special> {
            let id = *ids.first()?;
            Some(Special {
                text: inner.token(id)?,
                id,
            })
        };

        let gen_eos = match &gen {
            Some(g) => id_list_field(&gen_path, g, "eos_token_id")?,
            None => Vec::new(),
        };
        let gen_bos = match &gen {
            Some(g) => id_list_field(&gen_path, g, "bos_token_id")?,
            None => Vec::new(),
        };
        let bos = match special("bos_token")? {
            Some(s) => Some(s),
            None => from_id(gen_bos),
        };
        let eos = match special("eos_token")? {
            Some(s) => Some(s),
            None => from_id(gen_eos.clone()),
        };

        let add_bos_token = match cfg.as_ref().and_then(|c| c.get("add_bos_token")) {
            None | Some(Json::Null) => None,
            Some(Json::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(TokenizerError::Field {
                    path: cfg_path,
                    field: "add_bos_token".into(),
                    message: format!("expected true or false, found {other}"),
                })
            }
        };

        let mut stop_ids = Vec::new();
        let end_of_turn = inner.token_id(END_OF_TURN);
        for id in gen_eos
            .into_iter()
            .chain(eos.as_ref().map(|s| s.id))
            .chain(end_of_turn)
        {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }

        let chat_template = match &cfg {
            Some(c) => chat_template_field(&cfg_path, c)?,
            None => None,
        };
        let chat_template = match chat_template {
            Some(t) => Some(t),
            None => chat_template_file(dir)?,
        };

        Ok(Tokenizer {
            inner,
            vocab_size,
            bos,
            eos,
            add_bos_token,
            stop_ids,
            chat_template,
        })
    }

    /// A model directory without `tokenizer.json`: no vocabulary; BOS and the stop ids from
    /// `generation_config.json` when it is there.
    fn without_vocabulary(dir: &Path) -> Result<Self, TokenizerError> {
        let gen_path = dir.join("generation_config.json");
        let (mut stop_ids, bos) = match read_optional_json(&gen_path)? {
            Some(g) => (
                id_list_field(&gen_path, &g, "eos_token_id")?,
                id_list_field(&gen_path, &g, "bos_token_id")?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        stop_ids.dedup();
        Ok(Tokenizer {
            inner: Implementation::Absent(dir.to_path_buf()),
            vocab_size: 0,
            bos: bos.first().map(|&id| Special {
                text: String::new(),
                id,
            }),
            eos: None,
            add_bos_token: None,
            stop_ids,
            chat_template: None,
        })
    }

    /// Whether text can be encoded and decoded (false for a model directory without
    /// `tokenizer.json`).
    pub fn has_vocabulary(&self) -> bool {
        !matches!(self.inner, Implementation::Absent(_))
    }

    /// A tokenizer from a SentencePiece vocabulary (GGUF metadata). Stop ids: EOS, then
    /// `<end_of_turn>` when the vocabulary has it; the chat template is GGUF's
    /// `tokenizer.chat_template` when present.
    pub fn from_spm(spm: spm::SpmTokenizer, chat_template: Option<String>) -> Self {
        let inner = Implementation::SentencePiece(Box::new(spm));
        let special = |id: Option<u32>| {
            id.and_then(|id| {
                Some(Special {
                    text: inner.token(id)?,
                    id,
                })
            })
        };
        let (bos, eos) = match &inner {
            Implementation::SentencePiece(s) => (special(s.bos()), special(s.eos())),
            Implementation::HuggingFace(_) | Implementation::Absent(_) => (None, None),
        };
        let mut stop_ids: Vec<u32> = eos.iter().map(|s| s.id).collect();
        if let Some(id) = inner.token_id(END_OF_TURN).filter(|id| !stop_ids.contains(id)) {
            stop_ids.push(id);
        }
        let vocab_size = inner.vocab_size();
        Tokenizer {
            inner,
            vocab_size,
            bos,
            eos,
            add_bos_token: None,
            stop_ids,
            chat_template,
        }
    }

    /// Encodes `text` into token ids.
    ///
    /// With `add_special`, special tokens are added as the model's files ask: the `tokenizer.json`
    /// post-processor, adjusted by `add_bos_token` of `tokenizer_config.json` when that is set
    /// (BOS is then prepended if missing, or removed if the post-processor added it). Special
    /// tokens written in `text` (such as `<start_of_turn>`) are always recognised. Encode a
    /// rendered chat prompt (which already starts with `<bos>`) with `add_special = false`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let (mut ids, first_is_added) = self.inner.encode(text, add_special)?;
        if add_special {
            if let (Some(want), Some(bos)) = (self.add_bos_token, &self.bos) {
                let has_added_bos = first_is_added && ids.first() == Some(&bos.id);
                if want && !has_added_bos {
                    ids.insert(0, bos.id);
                } else if !want && has_added_bos {
                    ids.remove(0);
                }
            }
        }
        Ok(ids)
    }

    /// Decodes token ids into text; with `skip_special`, special tokens (`<bos>`,
    /// `<end_of_turn>`, ...) are left out. An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.check_ids(ids)?;
        self.inner.decode(ids, skip_special)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), TokenizerError> {
        match ids
            .iter()
            .find(|&&id| id as usize >= self.vocab_size || !self.inner.has_id(id))
        {
            Some(&id) => Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// The number of ids the tokenizer knows: one more than its largest id, added tokens
    /// included. (The model's embedding table may have more rows than this.)
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of the beginning-of-sequence token (`bos_token` of `tokenizer_config.json`, else
    /// `bos_token_id` of `generation_config.json`).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|s| s.id)
    }

    /// The ids that end generation, without duplicates, in this order: `eos_token_id` of
    /// `generation_config.json` (an id or a list), the id of `eos_token` of
    /// `tokenizer_config.json`, and `<end_of_turn>` if the vocabulary has it.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The id of a token given by its text (`"<end_of_turn>"`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_id(token)
    }

    /// The chat template: `chat_template` of `tokenizer_config.json` (a string, or the entry
    /// named `"default"` of a list of `{name, template}`), else `chat_template.jinja`, else
    /// `chat_template` of `chat_template.json`. `None` when the files have none.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The text of the beginning-of-sequence token (`"<bos>"`), for the chat template.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().map(|s| s.text.as_str())
    }

    /// The text of the end-of-sequence token (`"<eos>"`), for the chat template.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().map(|s| s.text.as_str())
    }

    /// The bytes token `id` stands for on its own: a byte-fallback token's one byte (`<0xE2>`,
    /// part of a character), else its text as the decoder writes it (`▁` as a space), a special
    /// token's spelling (`<end_of_turn>`) included. `None` for an id the vocabulary lacks (and
    /// without a vocabulary). For log-probabilities, which name every token.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.inner.token_bytes(id)
    }

    /// A [`StreamDecoder`] over this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }
}

/// Incremental detokenizer for streaming output.
///
/// Decoding token by token is wrong in general: byte-fallback tokens (`<0xE2>`) can split one
/// character across tokens, invalid bytes become U+FFFD depending on their neighbours, and some
/// decoders change a token's text depending on its position. `StreamDecoder` decodes a short
/// window of recent ids with the tokenizer's own decode and releases only text that no later id
/// can change. Concatenating every `push` result and then `finish` gives exactly the text of
/// [`Tokenizer::decode`] of all ids (for decoders without context-dependent stripping, such as
/// Gemma's); text once released is never taken back.
///
/// What is held back depends on how the vocabulary renders invalid UTF-8 in a run of byte tokens
/// (consecutive but for special tokens that `skip_special` leaves out):
/// - `tokenizer.json` (`ByteFallback`): a run that is not valid UTF-8 as a whole becomes one
///   U+FFFD per byte, so a later byte can still spoil characters the run already completed. A
///   run is held until another token ends it, or until it is proven invalid (a byte that no
///   continuation can make valid), after which its U+FFFDs, one per byte, come out at once.
/// - SentencePiece from GGUF: all bytes are joined and each invalid sequence becomes one U+FFFD,
///   so only an incomplete character at the end is held, until it completes or is proven
///   invalid.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    /// The window: `ids[..context]`, released in an earlier step, are decoded again only as the
    /// context of the text after them; `ids[context..]` are the ids since. Ids before the window
    /// have been released and dropped. The window always starts where no later id can change
    /// the text before it (see [`Tail::Final`]).
    ids: Vec<u32>,
    context: usize,
    /// How many bytes of the text of `ids[context..]` (the decode of `ids` after that of
    /// `ids[..context]`) have been released.
    released: usize,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with no ids yet. `skip_special` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            context: 0,
            released: 0,
        }
    }

    /// Adds one id; returns the text that is now final, or `None` if there is none yet (a skipped
    /// special token, or byte tokens held back as the type documentation describes). An id
    /// outside the vocabulary is an error and is not added.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.tokenizer.check_ids(&[id])?;
        self.ids.push(id);
        self.release(false)
    }

    /// Flushes text held back (an incomplete character at the end comes out as U+FFFD, as
    /// [`Tokenizer::decode`] renders it) and resets the decoder. Returns `None` if nothing was
    /// held back.
    pub fn finish(&mut self) -> Result<Option<String>, TokenizerError> {
        let out = self.release(true);
        self.ids.clear();
        self.context = 0;
        self.released = 0;
        out
    }

    /// Releases the text of the window that is final (all of it `at_end`), and moves the window
    /// on when no held-back ids remain.
    fn release(&mut self, at_end: bool) -> Result<Option<String>, TokenizerError> {
        let inner = &self.tokenizer.inner;
        let prefix = inner.decode(&self.ids[..self.context], self.skip_special)?;
        let full = inner.decode(&self.ids, self.skip_special)?;
        // The new text starts after the context's; a decoder that rewrites the context's text
        // (none of Gemma's do) is followed by length where that is a character boundary.
        if !full.starts_with(&prefix) && !full.is_char_boundary(prefix.len()) {
            return Ok(None);
        }
        let from = prefix.len() + self.released;
        let tail = if at_end { Tail::Final } else { self.tail() };
        let to = match tail {
            Tail::Final | Tail::Open => full.len(),
            Tail::HeldFrom(at) => {
                let kept = inner.decode(&self.ids[..at], self.skip_special)?;
                if full.starts_with(&kept) {
                    kept.len()
                } else {
                    from
                }
            }
        };
        let new = match full.get(from..to) {
            Some(new) if to > from => new,
            _ => "",
        };
        self.released += new.len();
        if tail == Tail::Final {
            // Every id so far is final: the ids of this step become the next step's context.
            self.ids.drain(..self.context);
            self.context = self.ids.len();
            self.released = 0;
        }
        Ok((!new.is_empty()).then(|| new.to_owned()))
    }

    /// Whether later ids can change the text of the window's end: the ids of the last run of
    /// byte tokens (skipped special tokens do not end a run; any other token does).
    fn tail(&self) -> Tail {
        let inner = &self.tokenizer.inner;
        // The run, last byte first, with the index of each byte's id.
        let mut run: Vec<(usize, u8)> = Vec::new();
        for (at, &id) in self.ids.iter().enumerate().rev() {
            match inner.piece(id, self.skip_special) {
                Piece::Hidden => {}
                Piece::Byte(b) => run.push((at, b)),
                Piece::Text => break,
            }
        }
        if run.is_empty() {
            return Tail::Final;
        }
        run.reverse();
        let bytes: Vec<u8> = run.iter().map(|&(_, b)| b).collect();
        if inner.invalid_runs_fail_whole() {
            // One invalid sequence anywhere makes the whole run U+FFFD, one per byte, whatever
            // follows: final up to here, though the run is still open. Otherwise any byte could
            // still spoil it.
            match std::str::from_utf8(&bytes) {
                Err(e) if e.error_len().is_some() => Tail::Open,
                _ => Tail::HeldFrom(run[0].0),
            }
        } else {
            // Each invalid sequence is one U+FFFD on its own: only an incomplete character at
            // the end can change.
            match incomplete_tail(&bytes) {
                0 => Tail::Final,
                n => Tail::HeldFrom(run[run.len() - n].0),
            }
        }
    }
}

/// How much of a [`StreamDecoder`]'s window is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// All of it, and no later id can change it: the window may move on. The window ends after
    /// a token that is not a byte token (skipped special tokens aside), or, for SentencePiece,
    /// after bytes that end no incomplete character.
    Final,
    /// All of its text so far, but it ends inside a run of byte tokens that later ids may
    /// extend (a `tokenizer.json` run already proven invalid).
    Open,
    /// The text of the ids before this index; the rest is held back.
    HeldFrom(usize),
}

/// How one token takes part in decoding, for [`StreamDecoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// Left out of the text: a special token under `skip_special`, a token without text.
    Hidden,
    /// A byte-fallback token (`<0xE2>`) and its byte.
    Byte(u8),
    /// Any other token. It ends a run of byte tokens.
    Text,
}

impl Implementation {
    /// How token `id` takes part in decoding, as [`Implementation::decode`] treats it.
    fn piece(&self, id: u32, skip_special: bool) -> Piece {
        match self {
            Implementation::HuggingFace(tok) => {
                // As `tokenizers` decodes: special tokens are dropped before the decoders run,
                // and `ByteFallback` gathers the runs of tokens spelled `<0xNN>`.
                let Some(token) = tok.id_to_token(id) else {
                    return Piece::Hidden;
                };
                if skip_special && tok.get_added_vocabulary().is_special_token(&token) {
                    Piece::Hidden
                } else if let Some(b) = spm::byte_token_value(&token) {
                    Piece::Byte(b)
                } else {
                    Piece::Text
                }
            }
            Implementation::SentencePiece(spm) => {
                let Some(token) = spm.token_to_piece(id) else {
                    return Piece::Hidden;
                };
                if skip_special && spm.is_special(id) {
                    Piece::Hidden
                } else if let Some(b) = spm::byte_token_value(token) {
                    Piece::Byte(b)
                } else if token.is_empty() {
                    Piece::Hidden
                } else {
                    Piece::Text
                }
            }
            Implementation::Absent(_) => Piece::Hidden,
        }
    }

    /// Whether a run of byte tokens that is not valid UTF-8 as a whole decodes to one U+FFFD per
    /// byte (`tokenizers`' `ByteFallback`), rather than one U+FFFD per invalid sequence
    /// (SentencePiece's decode, `String::from_utf8_lossy` of all bytes).
    fn invalid_runs_fail_whole(&self) -> bool {
        matches!(self, Implementation::HuggingFace(_))
    }
}

/// The length of the incomplete character that `bytes` end with (0 if none): the bytes after
/// the last complete character or invalid sequence that a longer text could still complete.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                None => return rest.len() - e.valid_up_to(),
                Some(n) => rest = &rest[e.valid_up_to() + n..],
            },
        }
    }
}

fn read_to_string(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads and parses a JSON file; `Ok(None)` if it does not exist.
fn read_optional_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TokenizerError::Json {
            path: path.to_owned(),
            source,
        })
}

/// A token field of `tokenizer_config.json`: a string, `{"content": string, ...}` or null.
fn token_field(path: &Path, cfg: &Json, field: &str) -> Result<Option<String>, TokenizerError> {
    let err = |found: &Json| TokenizerError::Field {
        path: path.to_owned(),
        field: field.to_owned(),
        message: format!("expected a string or an object with \"content\", found {found}"),
    };
    match cfg.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(obj @ Json::Object(map)) => match map.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(err(obj)),
        },
        Some(other) => Err(err(other)),
    }
}

/// An id field of `generation_config.json`: an integer, a list of integers, or null.
fn id_list_field(path: &Path, cfg: &Json, field: &str) -> Result<Vec<u32>, TokenizerError> {
    let as_id = |v: &Json| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| TokenizerError::Field {
                path: path.to_owned(),
                field: field.to_owned(),
                message: format!("expected a token id (a non-negative integer), found {v}"),
            })
    };
    match cfg.get(field) {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(as_id).collect(),
        Some(v) => Ok(vec![as_id(v)?]),
    }
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of `{name, template}` from
/// which the one named `"default"` is taken (as `transformers` does).
fn chat_template_field(path: &Path, cfg: &Json) -> Result<Option<String>, TokenizerError> {
    let field_err = |field: String, message: String| TokenizerError::Field {
        path: path.to_owned(),
        field,
        message,
    };
    match cfg.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(items)) => {
            let mut names = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let name = item.get("name").and_then(Json::as_str).ok_or_else(|| {
                    field_err(format!("chat_template[{i}].name"), "expected a string".into())
                })?;
                let template = item.get("template").and_then(Json::as_str).ok_or_else(|| {
                    field_err(format!("chat_template[{i}].template"), "expected a string".into())
                })?;
                if name == "default" {
                    return Ok(Some(template.to_owned()));
                }
                names.push(name);
            }
            Err(field_err(
                "chat_template".into(),
                format!("no template named \"default\" (found {names:?})"),
            ))
        }
        Some(other) => Err(field_err(
            "chat_template".into(),
            format!("expected a string or a list of {{name, template}}, found {other}"),
        )),
    }
}

/// The chat template from `chat_template.jinja` or `chat_template.json`, if either exists.
fn chat_template_file(dir: &Path) -> Result<Option<String>, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(t) => return Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(TokenizerError::Io { path: jinja, source }),
    }
    let json_path = dir.join("chat_template.json");
    match read_optional_json(&json_path)? {
        None => Ok(None),
        Some(j) => match j.get("chat_template") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            other => Err(TokenizerError::Field {
                path: json_path,
                field: "chat_template".into(),
                message: format!(
                    "expected a string, found {}",
                    other.map_or("nothing".to_owned(), Json::to_string)
                ),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PAD: u32 = 0;
    const EOS: u32 = 1;
    const BOS: u32 = 2;
    const SOT: u32 = 3;
    const EOT: u32 = 4;
    /// Byte-fallback tokens `<0x00>`..`<0xFF>` take ids 5..261.
    const BYTE0: u32 = 5;
    const FIRST_WORD: u32 = BYTE0 + 256;
    const WORDS: &[&str] = &["▁", "h", "e", "l", "o", "▁h", "▁he", "ll", "llo", "▁hello", "é"];

    fn word_id(w: &str) -> u32 {
        FIRST_WORD + WORDS.iter().position(|&x| x == w).unwrap() as u32
    }

    /// A small Gemma-like BPE tokenizer: metaspace, byte fallback, a BOS post-processor.
    fn tokenizer_json() -> Json {
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
            .iter()
            .enumerate()
        {
            vocab.insert((*t).into(), json!(i));
        }
        for b in 0..256u32 {
            vocab.insert(format!("<0x{b:02X}>"), json!(BYTE0 + b));
        }
        for (i, w) in WORDS.iter().enumerate() {
            vocab.insert((*w).into(), json!(FIRST_WORD + i as u32));
        }
        let added: Vec<Json> = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": null,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}}
            },
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"}
            ]},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab,
                "merges": ["▁ h", "▁h e", "l l", "ll o", "▁he llo"]
            }
        })
    }

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            let f = Files {
                dir: tempfile::tempdir().unwrap(),
            };
            f.write("tokenizer.json", &tokenizer_json().to_string());
            f
        }
        fn write(&self, name: &str, text: &str) {
            std::fs::write(self.dir.path().join(name), text).unwrap();
        }
        fn load(&self) -> Result<Tokenizer, TokenizerError> {
            Tokenizer::from_dir(self.dir.path())
        }
    }

    fn gemma_like() -> Tokenizer {
        let f = Files::new();
        f.write(
            "tokenizer_config.json",
            &json!({
                "add_bos_token": true,
                "bos_token": {"content": "<bos>", "lstrip": false},
                "eos_token": "<eos>",
                "chat_template": "{{ bos_token }}hi"
            })
            .to_string(),
        );
        f.write(
            "generation_config.json",
            &json!({"eos_token_id": [EOS, EOT], "bos_token_id": BOS}).to_string(),
        );
        f.load().unwrap()
    }

    #[test]
    fn encode_adds_bos_and_merges() {
        let t = gemma_like();
        assert_eq!(t.encode(" hello", true).unwrap(), vec![BOS, word_id("▁hello")]);
        assert_eq!(t.encode(" hello", false).unwrap(), vec![word_id("▁hello")]);
        assert_eq!(
            t.encode("<start_of_turn>hello<end_of_turn>", false).unwrap(),
            vec![SOT, word_id("h"), word_id("e"), word_id("llo"), EOT]
        );
    }

    #[test]
    fn add_bos_token_false_removes_post_processor_bos() {
        let f = Files::new();
        f.write(
            "tokenizer_config.json",
            r#"{"add_bos_token": false, "bos_token": "<bos>"}"#,
        );
        let t = f.load().unwrap();
        assert_eq!(t.encode(" hello", true).unwrap(), vec![word_id("▁hello")]);
    }

    #[test]
    fn add_bos_token_true_prepends_missing_bos() {
        let f = Files::new();
        let mut json = tokenizer_json();
        json["post_processor"] = Json::Null;
        f.write("tokenizer.json", &json.to_string());
        f.write(
            "tokenizer_config.json",
            r#"{"add_bos_token": true, "bos_token": "<bos>"}"#,
        );
        let t = f.load().unwrap();
        assert_eq!(t.encode(" hello", true).unwrap(), vec![BOS, word_id("▁hello")]);
        assert_eq!(t.encode(" hello", false).unwrap(), vec![word_id("▁hello")]);
    }

    #[test]
    fn byte_fallback_round_trip() {
        let t = gemma_like();
        // '€' is not in the vocabulary: three byte tokens.
        let ids = t.encode("€", false).unwrap();
        assert_eq!(ids, vec![BYTE0 + 0xE2, BYTE0 + 0x82, BYTE0 + 0xAC]);
        assert_eq!(t.decode(&ids, false).unwrap(), "€");
        let ids = t.encode(" hello €é", true).unwrap();
        assert_eq!(t.decode(&ids, true).unwrap(), " hello €é");
        assert_eq!(t.decode(&ids, false).unwrap(), "<bos> hello €é");
    }

    #[test]
    fn special_ids_and_stop_ids_come_from_files() {
        let t = gemma_like();
        assert_eq!(t.bos_id(), Some(BOS));
        assert_eq!(t.bos_token(), Some("<bos>"));
        assert_eq!(t.eos_token(), Some("<eos>"));
        assert_eq!(t.stop_ids(), &[EOS, EOT]);
        assert_eq!(t.token_id("<end_of_turn>"), Some(EOT));
        assert_eq!(t.token_id("<nope>"), None);
        assert_eq!(t.token_id("<pad>"), Some(PAD));
        assert_eq!(t.vocab_size(), FIRST_WORD as usize + WORDS.len());
        assert_eq!(t.chat_template(), Some("{{ bos_token }}hi"));
    }

    #[test]
    fn stop_ids_from_single_int_and_eos_token() {
        let f = Files::new();
        f.write("generation_config.json", r#"{"eos_token_id": 1}"#);
        let t = f.load().unwrap();
        assert_eq!(t.stop_ids(), &[EOS, EOT]);
        assert_eq!(t.eos_token(), Some("<eos>"));
        assert_eq!(t.bos_id(), None);
        assert_eq!(t.chat_template(), None);
        // With only tokenizer.json, the post-processor still adds BOS.
        assert_eq!(t.encode(" hello", true).unwrap()[0], BOS);
    }

    #[test]
    fn chat_template_list_form_picks_default() {
        let f = Files::new();
        f.write(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}]}"#,
        );
        assert_eq!(f.load().unwrap().chat_template(), Some("D"));
        f.write(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
        );
        let err = f.load().unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json") && err.contains("chat_template"),
            "{err}"
        );
    }

    #[test]
    fn chat_template_from_jinja_file() {
        let f = Files::new();
        f.write("chat_template.jinja", "J");
        assert_eq!(f.load().unwrap().chat_template(), Some("J"));
    }

    #[test]
    fn errors_name_file_and_field() {
        let f = Files::new();
        f.write("tokenizer_config.json", "{not json");
        let err = f.load().unwrap_err().to_string();
        assert!(err.contains("tokenizer_config.json"), "{err}");

        f.write("tokenizer_config.json", r#"{"eos_token": 5}"#);
        let err = f.load().unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json") && err.contains("eos_token"),
            "{err}"
        );

        f.write("tokenizer_config.json", r#"{"eos_token": "<missing>"}"#);
        let err = f.load().unwrap_err().to_string();
        assert!(err.contains("<missing>"), "{err}");

        f.write("tokenizer_config.json", "{}");
        f.write("generation_config.json", r#"{"eos_token_id": [1, "x"]}"#);
        let err = f.load().unwrap_err().to_string();
        assert!(
            err.contains("generation_config.json") && err.contains("eos_token_id"),
            "{err}"
        );

        f.write("generation_config.json", "{}");
        f.write("tokenizer.json", "[1, 2");
        let err = f.load().unwrap_err().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");

        f.write("tokenizer.json", r#"{"model": 3}"#);
        let err = f.load().unwrap_err().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");

        // No tokenizer.json: token ids only; text fails naming the missing file.
        let empty = tempfile::tempdir().unwrap();
        let t = Tokenizer::from_dir(empty.path()).unwrap();
        assert!(!t.has_vocabulary());
        let err = t.encode("hi", true).unwrap_err().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
        let err = t.decode(&[2], true).unwrap_err().to_string();
        assert!(err.contains("not in the vocabulary"), "{err}");
    }

    #[test]
    fn without_tokenizer_json_the_stop_ids_come_from_generation_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"bos_token_id": 2, "eos_token_id": [1, 106]}"#,
        )
        .unwrap();
        let t = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(t.stop_ids(), &[1, 106]);
        assert_eq!(t.bos_id(), Some(2));
        assert!(t.stream_decoder(true).push(5).is_err());
    }

    #[test]
    fn decode_rejects_unknown_id() {
        let t = gemma_like();
        let n = t.vocab_size() as u32;
        let err = t.decode(&[BOS, n + 7], false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&(n + 7).to_string()) && msg.contains(&n.to_string()),
            "{msg}"
        );
    }

    #[test]
    fn stream_decoder_waits_for_complete_utf8() {
        let t = gemma_like();
        let mut s = t.stream_decoder(true);
        assert_eq!(s.push(BOS).unwrap(), None);
        assert_eq!(s.push(word_id("▁hello")).unwrap().as_deref(), Some(" hello"));
        assert_eq!(s.push(word_id("▁")).unwrap().as_deref(), Some(" "));
        assert_eq!(s.push(BYTE0 + 0xE2).unwrap(), None);
        assert_eq!(s.push(BYTE0 + 0x82).unwrap(), None);
        // Complete, but a later byte could still turn the run into U+FFFDs: held until a token
        // that is not a byte token ends the run.
        assert_eq!(s.push(BYTE0 + 0xAC).unwrap(), None);
        assert_eq!(s.push(word_id("é")).unwrap().as_deref(), Some("€é"));
        assert_eq!(s.push(EOT).unwrap(), None);
        assert_eq!(s.finish().unwrap(), None);
        assert!(s.push(t.vocab_size() as u32).is_err());
    }

    #[test]
    fn stream_decoder_matches_full_decode() {
        let t = gemma_like();
        let ids = t.encode(" hello €é hello€", false).unwrap();
        let mut s = t.stream_decoder(false);
        let mut out = String::new();
        for &id in &ids {
            out.extend(s.push(id).unwrap());
        }
        out.extend(s.finish().unwrap());
        assert_eq!(out, t.decode(&ids, false).unwrap());
        assert_eq!(out, " hello €é hello€");
    }

    #[test]
    fn token_bytes_are_a_words_text_a_byte_tokens_byte_and_a_specials_spelling() {
        let t = gemma_like();
        assert_eq!(t.token_bytes(word_id("▁hello")), Some(b" hello".to_vec()));
        assert_eq!(t.token_bytes(BYTE0 + 0xE2), Some(vec![0xE2]));
        assert_eq!(t.token_bytes(EOT), Some(b"<end_of_turn>".to_vec()));
        assert_eq!(t.token_bytes(t.vocab_size() as u32), None);
    }

    #[test]
    fn stream_decoder_finish_flushes_incomplete_bytes() {
        let t = gemma_like();
        let mut s = t.stream_decoder(false);
        assert_eq!(s.push(word_id("h")).unwrap().as_deref(), Some("h"));
        assert_eq!(s.push(BYTE0 + 0xE2).unwrap(), None);
        assert_eq!(s.finish().unwrap().as_deref(), Some("\u{FFFD}"));
        // Reset: a fresh start.
        assert_eq!(s.push(word_id("e")).unwrap().as_deref(), Some("e"));
    }

    /// The same vocabulary as [`gemma_like`] (same ids), as a SentencePiece vocabulary from GGUF
    /// metadata: its decode replaces invalid UTF-8 after joining all bytes (`from_utf8_lossy`),
    /// where `tokenizer.json`'s ByteFallback turns a whole invalid run into one U+FFFD per byte.
    fn spm_like() -> Tokenizer {
        let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
            .iter()
            .map(|t| (*t).to_owned())
            .collect();
        let mut types = vec![3; tokens.len()];
        for b in 0..256u32 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for w in WORDS {
            tokens.push((*w).to_owned());
            types.push(1);
        }
        let vocab = spm::SpmVocab {
            scores: (0..tokens.len()).map(|i| -(i as f32)).collect(),
            types,
            tokens,
            bos: Some(BOS),
            eos: Some(EOS),
            unk: None,
            add_bos: true,
            add_space_prefix: false,
        };
        Tokenizer::from_spm(spm::SpmTokenizer::new(vocab).unwrap(), None)
    }

    /// Everything a stream decoder releases for `ids`, `finish` included.
    fn streamed(t: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
        let mut s = t.stream_decoder(skip_special);
        let mut out = String::new();
        for &id in ids {
            out.extend(s.push(id).unwrap());
        }
        out.extend(s.finish().unwrap());
        out
    }

    fn bytes(bs: &[u8]) -> Vec<u32> {
        bs.iter().map(|&b| BYTE0 + u32::from(b)).collect()
    }

    #[test]
    fn stream_decoder_invalid_byte_runs_match_full_decode() {
        let h = word_id("h");
        let e = word_id("e");
        let cases: Vec<Vec<u32>> = vec![
            // A lead byte cut short by an ASCII byte, inside one run.
            [vec![h], bytes(&[0xE2, b'A']), vec![e]].concat(),
            // A complete character, then a byte that spoils the run.
            [vec![h], bytes(&[0xE2, 0x82, 0xAC, 0xFF]), vec![e, e]].concat(),
            // The issue's shape: ASCII, a cut lead byte, then continuation bytes, then words.
            [bytes(&[b'l', 0xE1, b'#', 0xAB, 0xAB, 0xAB, 0xAB]), vec![e, e, h]].concat(),
            // A cut character at the very end.
            [vec![h], bytes(&[0xF0, 0x9F])].concat(),
            // Special tokens inside a run.
            [
                vec![BOS],
                bytes(&[0xE2]),
                vec![EOT],
                bytes(&[0x82, 0xAC]),
                vec![h],
            ]
            .concat(),
            [
                vec![BOS],
                bytes(&[0xE2]),
                vec![EOT],
                bytes(&[0x82, 0xAC]),
                vec![EOT],
            ]
            .concat(),
            [bytes(&[0xC3]), vec![SOT, h], bytes(&[0xA9])].concat(),
        ];
        for (name, t) in [("tokenizer.json", gemma_like()), ("GGUF", spm_like())] {
            for ids in &cases {
                for skip in [true, false] {
                    assert_eq!(
                        streamed(&t, ids, skip),
                        t.decode(ids, skip).unwrap(),
                        "{name}: ids {ids:?}, skip_special {skip}"
                    );
                }
            }
        }
        // tokenizer.json's ByteFallback: a run that is not UTF-8 as a whole is one U+FFFD per
        // byte, the ASCII byte included.
        let t = gemma_like();
        assert_eq!(t.decode(&cases[0], true).unwrap(), "h\u{FFFD}\u{FFFD}e");
        assert_eq!(
            t.decode(&cases[2], true).unwrap(),
            format!("{}eeh", "\u{FFFD}".repeat(7))
        );
        assert_eq!(t.decode(&cases[4], true).unwrap(), "€h");
        assert_eq!(
            t.decode(&cases[4], false).unwrap(),
            "<bos>\u{FFFD}<end_of_turn>\u{FFFD}\u{FFFD}h"
        );
    }

    #[test]
    fn stream_decoder_releases_proven_invalid_bytes_at_once() {
        let t = gemma_like();
        let mut s = t.stream_decoder(true);
        assert_eq!(s.push(word_id("h")).unwrap().as_deref(), Some("h"));
        // `l` could still become part of a run that fails as a whole: held.
        assert_eq!(s.push(BYTE0 + u32::from(b'l')).unwrap(), None);
        assert_eq!(s.push(BYTE0 + 0xE1).unwrap(), None);
        // `#` cuts the character short: the run fails, whatever comes next.
        assert_eq!(
            s.push(BYTE0 + u32::from(b'#')).unwrap().as_deref(),
            Some("\u{FFFD}\u{FFFD}\u{FFFD}")
        );
        assert_eq!(s.push(BYTE0 + 0xAB).unwrap().as_deref(), Some("\u{FFFD}"));
        assert_eq!(s.push(EOT).unwrap(), None);
        assert_eq!(s.push(word_id("e")).unwrap().as_deref(), Some("e"));
        assert_eq!(s.finish().unwrap(), None);

        // SentencePiece joins all bytes and replaces each bad sequence by one U+FFFD: a complete
        // character is final at once, an incomplete one waits.
        let t = spm_like();
        let mut s = t.stream_decoder(true);
        assert_eq!(s.push(BYTE0 + u32::from(b'l')).unwrap().as_deref(), Some("l"));
        assert_eq!(s.push(BYTE0 + 0xE1).unwrap(), None);
        assert_eq!(
            s.push(BYTE0 + u32::from(b'#')).unwrap().as_deref(),
            Some("\u{FFFD}#")
        );
        assert_eq!(s.push(BYTE0 + 0xAB).unwrap().as_deref(), Some("\u{FFFD}"));
        assert_eq!(s.push(BYTE0 + 0xE2).unwrap(), None);
        assert_eq!(s.push(BYTE0 + 0x82).unwrap(), None);
        assert_eq!(s.push(BYTE0 + 0xAC).unwrap().as_deref(), Some("€"));
        assert_eq!(s.push(BYTE0 + 0xF0).unwrap(), None);
        assert_eq!(s.finish().unwrap().as_deref(), Some("\u{FFFD}"));
    }

    /// The tokenizer of the `text-published` fixture (tests/fixtures/models).
    fn fixture_tokenizer() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/text-published");
        Tokenizer::from_dir(&dir).unwrap()
    }

    /// Issue 53 ("lost output"): the `text-published` fixture, prompt [2,17,5,9,11,30],
    /// temperature 0, repetition penalty 1.3 generates these ids; the stream released "l" and
    /// then nothing more.
    #[test]
    fn stream_decoder_issue_53_fixture_ids() {
        let t = fixture_tokenizer();
        let ids = [118, 235, 45, 181, 181, 181, 181, 292, 292, 292, 484, 484, 1];
        let full = t.decode(&ids, true).unwrap();
        assert_eq!(full, format!("{}OOO con con", "\u{FFFD}".repeat(7)));
        assert_eq!(streamed(&t, &ids, true), full);
        assert_eq!(streamed(&t, &ids, false), t.decode(&ids, false).unwrap());
    }

    mod stream_props {
        use super::*;
        use proptest::prelude::*;

        /// Ids that matter to streaming: the special tokens, byte tokens (ASCII, continuation,
        /// lead bytes, bytes never valid), words; and whole characters spelled in byte tokens.
        fn ids() -> impl Strategy<Value = Vec<u32>> {
            let interesting: Vec<u32> = (PAD..=EOT)
                .chain(
                    [
                        0x00, b'A', b' ', 0x7F, 0x80, 0x82, 0x9F, 0xA9, 0xAC, 0xBF, 0xC0, 0xC3, 0xE2, 0xED,
                        0xF0, 0xF4, 0xF5, 0xFF,
                    ]
                    .iter()
                    .map(|&b| BYTE0 + u32::from(b)),
                )
                .chain(FIRST_WORD..FIRST_WORD + WORDS.len() as u32)
                .collect();
            let unit = prop_oneof![
                3 => prop::sample::select(interesting).prop_map(|id| vec![id]),
                1 => any::<char>().prop_map(|c| bytes(c.to_string().as_bytes())),
                1 => any::<char>().prop_flat_map(|c| {
                    // A character cut short.
                    let b = bytes(c.to_string().as_bytes());
                    let n = b.len();
                    (Just(b), 0..n).prop_map(|(b, k)| b[..k].to_vec())
                }),
            ];
            prop::collection::vec(unit, 0..16).prop_map(|units| units.concat())
        }

        fn check(t: &Tokenizer, ids: &[u32], skip: bool) -> Result<(), TestCaseError> {
            let mut s = t.stream_decoder(skip);
            let mut out = String::new();
            for (k, &id) in ids.iter().enumerate() {
                out.extend(s.push(id).unwrap());
                // Once the last token shown is not a byte token, all text so far is out.
                let shown = ids[..=k].iter().rev().find(|&&i| !(skip && i <= EOT));
                if shown.is_none_or(|&i| !(BYTE0..FIRST_WORD).contains(&i)) {
                    prop_assert_eq!(&out, &t.decode(&ids[..=k], skip).unwrap(), "after {} ids", k + 1);
                }
            }
            out.extend(s.finish().unwrap());
            prop_assert_eq!(out, t.decode(ids, skip).unwrap());
            // finish resets: the decoder starts again.
            prop_assert_eq!(streamed(t, ids, skip), t.decode(ids, skip).unwrap());
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 512,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn streamed_text_is_the_full_decode(ids in ids(), skip in any::<bool>()) {
                check(&gemma_like(), &ids, skip)?;
                check(&spm_like(), &ids, skip)?;
            }

            /// Any ids of the `text-published` fixture's vocabulary (486 tokens: specials, the
            /// 256 byte tokens, words).
            #[test]
            fn streamed_text_is_the_full_decode_on_the_fixture(
                ids in prop::collection::vec(0..486u32, 0..24),
                skip in any::<bool>(),
            ) {
                static FIXTURE: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
                let t = FIXTURE.get_or_init(fixture_tokenizer);
                prop_assert_eq!(t.vocab_size(), 486);
                let mut s = t.stream_decoder(skip);
                let mut out = String::new();
                for &id in &ids {
                    out.extend(s.push(id).unwrap());
                }
                out.extend(s.finish().unwrap());
                prop_assert_eq!(out, t.decode(&ids, skip).unwrap());
            }
        }
    }
}
