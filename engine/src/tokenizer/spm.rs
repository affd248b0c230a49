//! The SentencePiece tokenizer that a GGUF file describes with `tokenizer.ggml.model = "llama"`,
//! built from the file's metadata (tokens, scores, token types, special ids) rather than from a
//! `tokenizer.json`.
//!
//! It gives the ids that Hugging Face transformers gives for the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, which builds a `tokenizers` BPE model
//! from the vocabulary). For Gemma that is:
//!
//! 1. **Special tokens.** Control tokens (type 3), user-defined tokens (type 4) and the BOS, EOS
//!    and unknown tokens are found in the raw text first, leftmost-longest, and each becomes its
//!    single id. `<start_of_turn>`, `\n\n`, `\t\t` and `<b>` are such tokens in Gemma 3.
//! 2. **Normalisation.** In the text between them every space (U+0020) becomes `▁` (U+2581). A
//!    `▁` is prepended to the piece that starts the text when the vocabulary asks for it
//!    (`add_space_prefix`; false for Gemma).
//! 3. **Symbols.** Each character is one symbol, its token; a character that is no token becomes
//!    its UTF-8 bytes as byte tokens `<0x00>`..`<0xFF>` (or the unknown token when the vocabulary
//!    has no byte tokens), which never merge.
//! 4. **Merges.** Repeatedly, the adjacent pair of symbols whose concatenation is a token and
//!    comes first in the [`MergeOrder`] is merged, the leftmost pair among equals. A priority queue
//!    of candidate pairs makes this `O(n log n)`.
//!
//! Where this differs from llama.cpp's `llm_tokenizer_spm` (transformers is followed):
//! - Gemma's GGUF spells its whitespace-run tokens with real spaces (`"  "`, id 138), which
//!   transformers respells as `▁▁` so that BPE can build them. They are then merge targets, not
//!   special tokens, and [`MergeOrder::TokenId`] ranks them first: `"    return"` is
//!   `▁▁▁▁` + `return`. llama.cpp matches them as user-defined tokens in the raw text, longest
//!   first, which differs on long runs of spaces.
//! - The merge order is the order of the tokens in the file, not their scores: Gemma gives its
//!   user-defined tokens a score of -1000, which would rank `▁▁` below 500 ordinary merges.
//! - Special tokens are matched leftmost-longest (llama.cpp: longest token first, anywhere).
//! - A character that is no token is byte-encoded at once (llama.cpp first tries to merge it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Token type (`tokenizer.ggml.token_type`) of the unknown token.
const TYPE_UNKNOWN: i32 = 2;
/// Token type of control tokens (`<bos>`, `<start_of_turn>`).
const TYPE_CONTROL: i32 = 3;
/// Token type of user-defined tokens (`\n\n`, `<b>`), matched whole in the text.
const TYPE_USER_DEFINED: i32 = 4;
/// Token type of byte tokens `<0x00>`..`<0xFF>`.
const TYPE_BYTE: i32 = 6;

/// User-defined tokens that are markers, not text: Gemma 3's multimodal tokens, which its
/// `tokenizer.json` marks special but llama.cpp's conversion types as user-defined, as it does
/// the HTML tags and whitespace runs that are text. Decoding with `skip_special` leaves them out.
const MARKERS: [&str; 4] = [
    "[multimodal]",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
];

/// The space replacement of SentencePiece, U+2581 LOWER ONE EIGHTH BLOCK.
const SPACE_MARK: char = '\u{2581}';

/// Errors from building a tokenizer from vocabulary metadata, or from decoding ids.
#[derive(Debug, thiserror::Error)]
pub enum SpmError {
    /// `tokenizer.ggml.tokens` has no entries.
    #[error("the SentencePiece vocabulary is empty (tokenizer.ggml.tokens has no entries)")]
    EmptyVocab,
    /// The token, score and token-type lists differ in length.
    #[error(
        "the SentencePiece vocabulary has {tokens} tokens but {scores} scores and {types} token \
         types (tokenizer.ggml.tokens/scores/token_type); all three must have the same length"
    )]
    LengthMismatch {
        /// Entries in `tokenizer.ggml.tokens`.
        tokens: usize,
        /// Entries in `tokenizer.ggml.scores`.
        scores: usize,
        /// Entries in `tokenizer.ggml.token_type`.
        types: usize,
    },
    /// The vocabulary has more tokens than a `u32` id can name.
    #[error("the SentencePiece vocabulary has {0} tokens; ids are u32, so at most 4294967295 fit")]
    TooLarge(usize),
    /// A BOS, EOS or unknown-token id names no token.
    #[error("{role} token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        /// Which id: `"bos"`, `"eos"` or `"unk"` (`tokenizer.ggml.<role>_token_id`).
        role: &'static str,
        /// The id given.
        id: u32,
        /// The number of tokens.
        vocab_size: usize,
    },
    /// The vocabulary has byte tokens, so it relies on byte fallback, but not all 256 of them.
    #[error(
        "the vocabulary has byte tokens (byte fallback) but lacks `{token}`; all of <0x00>..<0xFF> \
         are needed"
    )]
    MissingByteToken {
        /// The missing token, e.g. `<0x7F>`.
        token: String,
    },
    /// The vocabulary has neither byte tokens nor an unknown token.
    #[error(
        "the vocabulary has neither byte tokens <0x00>..<0xFF> nor an unknown token, so text \
         outside it cannot be encoded"
    )]
    NoFallback,
    /// [`SpmTokenizer::decode`] was given an id that names no token.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        /// The id given.
        id: u32,
        /// The number of tokens.
        vocab_size: usize,
    },
}

/// A SentencePiece vocabulary as GGUF metadata gives it (`tokenizer.ggml.*`).
#[derive(Debug, Clone, Default)]
pub struct SpmVocab {
    /// `tokenizer.ggml.tokens`: each token's text, `▁` standing for a space; the id is the index.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: one per token; the merge priority under [`MergeOrder::Score`].
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`: one per token. 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte; other values count as normal.
    pub types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: whether encoding with special tokens starts with BOS.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_space_prefix`: whether a `▁` is prepended to the start of the text.
    pub add_space_prefix: bool,
}

/// Which adjacent pair of symbols the tokenizer merges first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MergeOrder {
    /// The pair whose merged token has the smallest id. transformers builds Gemma tokenizers from
    /// GGUF this way, because Gemma's scores do not follow its merge order for user-defined
    /// tokens. Among splits of the same token, the one with the longer left part goes first.
    #[default]
    TokenId,
    /// The pair whose merged token has the highest score, as llama.cpp does, and transformers for
    /// SentencePiece vocabularies other than Gemma's. Among equal scores the longer left part,
    /// then the longer right part, then the smaller id go first.
    Score,
}

/// A SentencePiece tokenizer built from GGUF vocabulary metadata; see the module documentation.
#[derive(Debug)]
pub struct SpmTokenizer {
    /// Token texts as the vocabulary spells them.
    tokens: Vec<String>,
    /// Token types, as in [`SpmVocab::types`].
    types: Vec<i32>,
    /// Token text -> id, whitespace-run tokens respelled with `▁` (the last id wins on duplicates).
    by_text: HashMap<String, u32>,
    /// The original spelling of respelled tokens (`"  "`) -> id, for [`SpmTokenizer::id_of`].
    respelled: HashMap<String, u32>,
    /// Merge priority of each token: smaller merges first.
    rank: Vec<u32>,
    /// Byte tokens `<0x00>`..`<0xFF>`, when the vocabulary has them.
    byte_ids: Option<Box<[u32; 256]>>,
    /// The tokens matched whole in the raw text.
    specials: SpecialMatcher,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
}

impl SpmTokenizer {
    /// Builds the tokenizer with [`MergeOrder::TokenId`], the order transformers uses for Gemma.
    ///
    /// Fails when the token, score and type lists differ in length, a special id is out of range,
    /// or the vocabulary can encode neither every byte (`<0x00>`..`<0xFF>`) nor an unknown token.
    pub fn new(vocab: SpmVocab) -> Result<Self, SpmError> {
        Self::with_merge_order(vocab, MergeOrder::TokenId)
    }

    /// Builds the tokenizer with the given merge order; see [`SpmTokenizer::new`].
    pub fn with_merge_order(vocab: SpmVocab, order: MergeOrder) -> Result<Self, SpmError> {
        let SpmVocab {
            tokens,
            scores,
            types,
            bos,
            eos,
            unk,
            add_bos,
            add_space_prefix,
        } = vocab;
        let n = tokens.len();
        if n == 0 {
            return Err(SpmError::EmptyVocab);
        }
        if scores.len() != n || types.len() != n {
            return Err(SpmError::LengthMismatch {
                tokens: n,
                scores: scores.len(),
                types: types.len(),
            });
        }
        if u32::try_from(n).is_err() {
            return Err(SpmError::TooLarge(n));
        }
        for (role, id) in [("bos", bos), ("eos", eos), ("unk", unk)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(SpmError::SpecialIdOutOfRange {
                        role,
                        id,
                        vocab_size: n,
                    });
                }
            }
        }

        let mut by_text = HashMap::with_capacity(n);
        let mut respelled = HashMap::new();
        for (id, text) in (0u32..).zip(&tokens) {
            match respell_whitespace(text) {
                Some(piece) => {
                    respelled.insert(text.clone(), id);
                    by_text.insert(piece, id);
                }
                None => {
                    by_text.insert(text.clone(), id);
                }
            }
        }

        let uses_bytes = (0..n).any(|i| types[i] == TYPE_BYTE || byte_token_value(&tokens[i]).is_some());
        let byte_ids = if uses_bytes {
            let mut ids = Box::new([0u32; 256]);
            for (byte, slot) in ids.iter_mut().enumerate() {
                let token = format!("<0x{byte:02X}>");
                *slot = match by_text.get(&token) {
                    Some(&id) => id,
                    None => return Err(SpmError::MissingByteToken { token }),
                };
            }
            Some(ids)
        } else if unk.is_none() {
            return Err(SpmError::NoFallback);
        } else {
            None
        };

        let rank = match order {
            MergeOrder::TokenId => (0u32..).take(n).collect(),
            MergeOrder::Score => score_ranks(&scores),
        };

        let mut specials = SpecialMatcher::default();
        for (id, text) in (0u32..).zip(&tokens) {
            let kind = types[id as usize];
            let named = [bos, eos, unk].contains(&Some(id));
            if text.is_empty() || !(kind == TYPE_CONTROL || kind == TYPE_USER_DEFINED || named) {
                continue;
            }
            // transformers adds a user-defined token only when its spelling is in the (respelled)
            // vocabulary, and gives every added token the vocabulary's id for that spelling.
            match by_text.get(text.as_str()) {
                Some(&vocab_id) => specials.insert(text, vocab_id),
                None if kind != TYPE_USER_DEFINED => specials.insert(text, id),
                None => {}
            }
        }

        Ok(Self {
            tokens,
            types,
            by_text,
            respelled,
            rank,
            byte_ids,
            specials,
            bos,
            eos,
            unk,
            add_bos,
            add_space_prefix,
        })
    }

    /// Token ids for `text`, preceded by BOS when `add_bos` is true and the vocabulary has one.
    /// Callers pass `add_special && self.add_bos()`. Special tokens spelled out in the text
    /// (`<start_of_turn>`) become their single id.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        let bytes = text.as_bytes();
        let mut piece_start = 0;
        let mut at = 0;
        while at < bytes.len() {
            match self.specials.longest_match(bytes, at) {
                Some((len, id)) => {
                    self.encode_piece(&text[piece_start..at], piece_start == 0, &mut out);
                    out.push(id);
                    at += len;
                    piece_start = at;
                }
                None => at += utf8_len(bytes[at]),
            }
        }
        self.encode_piece(&text[piece_start..], piece_start == 0, &mut out);
        out
    }

    /// Text for `ids`: `▁` becomes a space, runs of byte tokens are reassembled into UTF-8, and
    /// control tokens (and BOS, EOS, unknown) are left out when `skip_special` is true. Invalid
    /// UTF-8 is replaced by U+FFFD once all ids are joined. Fails on an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, SpmError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let Some(token) = self.tokens.get(id as usize) else {
                return Err(SpmError::IdOutOfRange {
                    id,
                    vocab_size: self.tokens.len(),
                });
            };
            if skip_special && self.is_special(id) {
                continue;
            }
            match byte_token_value(token) {
                Some(byte) => bytes.push(byte),
                None => {
                    for c in token.chars() {
                        let c = if c == SPACE_MARK { ' ' } else { c };
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
    }

    /// The text of token `id` as the vocabulary spells it (`▁` for spaces, `<0x0A>` for byte
    /// tokens), or `None` when `id` is out of range.
    pub fn token_to_piece(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token spelled `piece` (`"<end_of_turn>"`, `"▁the"`). Whitespace-run tokens
    /// are found under both spellings (`"  "` and `"▁▁"`).
    pub fn id_of(&self, piece: &str) -> Option<u32> {
        self.by_text
            .get(piece)
            .or_else(|| self.respelled.get(piece))
            .copied()
    }

    /// The number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Whether `id` is a control token, the unknown token, BOS or EOS, or a user-defined marker
    /// (`<start_of_image>`: [`MARKERS`]): the tokens that decoding with `skip_special` leaves
    /// out. False for ids out of range.
    pub fn is_special(&self, id: u32) -> bool {
        match self.types.get(id as usize) {
            Some(&kind) => {
                kind == TYPE_CONTROL
                    || kind == TYPE_UNKNOWN
                    || [self.bos, self.eos, self.unk].contains(&Some(id))
                    || (kind == TYPE_USER_DEFINED && MARKERS.contains(&self.tokens[id as usize].as_str()))
            }
            None => false,
        }
    }

    /// The bytes token `id` stands for in text: a byte token's byte, else its text with `▁` as a
    /// space (a special token's spelling included); `None` when `id` is out of range.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.tokens.get(id as usize)?;
        Some(match byte_token_value(token) {
            Some(byte) => vec![byte],
            None => token.replace(SPACE_MARK, " ").into_bytes(),
        })
    }

    /// The BOS id, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS id, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The unknown-token id, if the vocabulary has one.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether the vocabulary asks for BOS at the start of encoded text (`add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Appends the ids of `piece`, text with no special tokens in it. `at_text_start`: whether it
    /// begins the whole text (where `add_space_prefix` puts its `▁`).
    fn encode_piece(&self, piece: &str, at_text_start: bool, out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        let mut text = String::with_capacity(piece.len() + 3 * 8);
        if self.add_space_prefix && at_text_start {
            text.push(SPACE_MARK);
        }
        for c in piece.chars() {
            text.push(if c == ' ' { SPACE_MARK } else { c });
        }

        let mut symbols = Vec::with_capacity(text.len());
        let mut last_was_unk = false;
        for (start, c) in text.char_indices() {
            let end = start + c.len_utf8();
            if let Some(&id) = self.by_text.get(&text[start..end]) {
                symbols.push(Symbol {
                    start,
                    end,
                    chars: 1,
                    id,
                    mergeable: true,
                    alive: true,
                });
                last_was_unk = false;
            } else if let Some(byte_ids) = &self.byte_ids {
                for &byte in &text.as_bytes()[start..end] {
                    let id = byte_ids[usize::from(byte)];
                    symbols.push(Symbol {
                        start,
                        end,
                        chars: 1,
                        id,
                        mergeable: false,
                        alive: true,
                    });
                }
            } else if let Some(unk) = self.unk {
                // Like transformers (`fuse_unk`): a run of unknown characters is one unknown token.
                if !last_was_unk {
                    symbols.push(Symbol {
                        start,
                        end,
                        chars: 1,
                        id: unk,
                        mergeable: false,
                        alive: true,
                    });
                }
                last_was_unk = true;
            }
        }
        self.merge(&text, &mut symbols);
        out.extend(symbols.iter().filter(|s| s.alive).map(|s| s.id));
    }

    /// Merges adjacent symbols of `text` in priority order until no pair forms a token. Merged
    /// symbols absorb their right neighbour, which is marked dead.
    fn merge(&self, text: &str, symbols: &mut [Symbol]) {
        let count = symbols.len();
        if count < 2 {
            return;
        }
        // Neighbours among live symbols; `count` marks "none".
        let mut prev: Vec<usize> = (0..count).map(|i| if i == 0 { count } else { i - 1 }).collect();
        let mut next: Vec<usize> = (1..=count).collect();
        let mut queue = BinaryHeap::with_capacity(count);
        for left in 0..count - 1 {
            self.push_candidate(text, symbols, left, left + 1, &mut queue);
        }
        while let Some(Reverse(candidate)) = queue.pop() {
            let Candidate {
                left,
                right,
                right_end,
                merged,
                ..
            } = candidate;
            // Skip candidates made stale by an earlier merge of either side.
            let (l, r) = (&symbols[left], &symbols[right]);
            if !l.alive || !r.alive || next[left] != right || r.end != right_end {
                continue;
            }
            let chars = l.chars + r.chars;
            symbols[left] = Symbol {
                end: right_end,
                chars,
                id: merged,
                ..symbols[left]
            };
            symbols[right].alive = false;
            let after = next[right];
            next[left] = after;
            if after < count {
                prev[after] = left;
                self.push_candidate(text, symbols, left, after, &mut queue);
            }
            if prev[left] < count {
                self.push_candidate(text, symbols, prev[left], left, &mut queue);
            }
        }
    }

    /// Queues the merge of symbols `left` and `right` if their concatenation is a token.
    fn push_candidate(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Reverse<Candidate>>,
    ) {
        let (l, r) = (&symbols[left], &symbols[right]);
        if !l.mergeable || !r.mergeable {
            return;
        }
        if let Some(&merged) = self.by_text.get(&text[l.start..r.end]) {
            queue.push(Reverse(Candidate {
                rank: self.rank[merged as usize],
                left_chars: Reverse(l.chars),
                right_chars: Reverse(r.chars),
                merged,
                left,
                right,
                right_end: r.end,
            }));
        }
    }
}

/// One symbol of a piece being merged: a token covering `text[start..end]`.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    /// Characters covered (transformers breaks ties between splits by their length in chars).
    chars: u32,
    id: u32,
    /// False for byte-fallback and unknown symbols, which never merge.
    mergeable: bool,
    alive: bool,
}

/// A possible merge; the derived order is the merge priority (smallest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left_chars: Reverse<u32>,
    right_chars: Reverse<u32>,
    merged: u32,
    /// Leftmost first among equal merges.
    left: usize,
    right: usize,
    /// Where the right symbol ended when this was queued; a different end means it has merged.
    right_end: usize,
}

/// Rank of each token under [`MergeOrder::Score`]: tokens with equal scores share a rank, higher
/// scores come first.
fn score_ranks(scores: &[f32]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut rank = vec![0u32; scores.len()];
    let mut current = 0u32;
    for (k, &id) in order.iter().enumerate() {
        if k > 0 && scores[order[k - 1]].total_cmp(&scores[id]).is_ne() {
            current += 1;
        }
        rank[id] = current;
    }
    rank
}

/// `Some("▁▁")` for a token made only of whitespace that contains a space (`"  "`): Gemma's GGUF
/// stores its whitespace-run tokens with real spaces, which transformers respells as one `▁` per
/// character so that they can be built by merges.
fn respell_whitespace(text: &str) -> Option<String> {
    // Python's `str.isspace`, which transformers uses, also counts U+001C..U+001F.
    let is_space = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    if text.contains(' ') && text.chars().all(is_space) {
        Some(SPACE_MARK.to_string().repeat(text.chars().count()))
    } else {
        None
    }
}

/// The byte a token spelled `<0xNN>` stands for.
pub(super) fn byte_token_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Length of the UTF-8 sequence that starts with `lead` (1 for bytes that cannot start one).
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// A byte trie of the tokens matched whole in raw text.
#[derive(Debug)]
struct SpecialMatcher {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Default)]
struct TrieNode {
    /// (byte, child node), sorted by byte.
    children: Vec<(u8, u32)>,
    /// The token spelled by the path to this node.
    token: Option<u32>,
}

impl Default for SpecialMatcher {
    fn default() -> Self {
        Self {
            nodes: vec![TrieNode::default()],
        }
    }
}

impl SpecialMatcher {
    /// Adds `text` as token `id`; a later spelling replaces an earlier one.
    fn insert(&mut self, text: &str, id: u32) {
        let mut node = 0usize;
        for &byte in text.as_bytes() {
            let fresh = self.nodes.len() as u32;
            let children = &mut self.nodes[node].children;
            node = match children.binary_search_by_key(&byte, |&(b, _)| b) {
                Ok(k) => children[k].1 as usize,
                Err(k) => {
                    children.insert(k, (byte, fresh));
                    self.nodes.push(TrieNode::default());
                    fresh as usize
                }
            };
        }
        self.nodes[node].token = Some(id);
    }

    /// The longest token that `text[at..]` starts with, as (length in bytes, id).
    fn longest_match(&self, text: &[u8], at: usize) -> Option<(usize, u32)> {
        let mut node = 0usize;
        let mut best = None;
        for (k, &byte) in text[at..].iter().enumerate() {
            let children = &self.nodes[node].children;
            match children.binary_search_by_key(&byte, |&(b, _)| b) {
                Ok(c) => node = children[c].1 as usize,
                Err(_) => break,
            }
            if let Some(id) = self.nodes[node].token {
                best = Some((k + 1, id));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of the given (text, type) pairs after Gemma-like specials and the 256 byte
    /// tokens; scores fall with the id, like Gemma's ordinary tokens.
    fn vocab_with(pieces: &[(&str, i32)], bytes: bool) -> SpmVocab {
        let mut tokens: Vec<(String, i32)> = [
            ("<pad>", 3),
            ("<eos>", 3),
            ("<bos>", 3),
            ("<unk>", 3),
            ("<start_of_turn>", 3),
            ("<end_of_turn>", 3),
            ("\n", 4),
            ("\n\n", 4),
            ("  ", 4),
            ("   ", 4),
            ("<b>", 4),
        ]
        .iter()
        .map(|&(t, k)| (t.to_string(), k))
        .collect();
        if bytes {
            tokens.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), TYPE_BYTE)));
        }
        tokens.extend(pieces.iter().map(|&(t, k)| (t.to_string(), k)));
        SpmVocab {
            scores: (0..tokens.len()).map(|i| -(i as f32)).collect(),
            types: tokens.iter().map(|t| t.1).collect(),
            tokens: tokens.into_iter().map(|t| t.0).collect(),
            bos: Some(2),
            eos: Some(1),
            unk: Some(3),
            add_bos: true,
            add_space_prefix: false,
        }
    }

    fn normal(pieces: &[&'static str]) -> Vec<(&'static str, i32)> {
        pieces.iter().map(|&p| (p, 1)).collect()
    }

    fn tokenizer(pieces: &[&'static str]) -> SpmTokenizer {
        SpmTokenizer::new(vocab_with(&normal(pieces), true)).expect("valid test vocabulary")
    }

    fn pieces(tok: &SpmTokenizer, text: &str) -> Vec<String> {
        let ids = tok.encode(text, false);
        ids.iter()
            .map(|&id| tok.token_to_piece(id).expect("id in range").to_string())
            .collect()
    }

    const LETTERS: [&str; 12] = ["▁", "a", "b", "c", "d", "e", "h", "i", "l", "o", "u", "s"];

    #[test]
    fn merges_follow_token_order_then_leftmost() {
        let mut words = LETTERS.to_vec();
        words.extend(["ab", "bc", "aa"]);
        let tok = tokenizer(&words);
        assert_eq!(pieces(&tok, "abc"), ["ab", "c"]);
        assert_eq!(pieces(&tok, "aaa"), ["aa", "a"]);

        let mut words = LETTERS.to_vec();
        words.extend(["bc", "ab"]);
        let tok = tokenizer(&words);
        assert_eq!(pieces(&tok, "abc"), ["a", "bc"]);
    }

    #[test]
    fn merges_build_words_and_space_marks() {
        let mut words = LETTERS.to_vec();
        words.extend(["he", "ll", "llo", "hello", "▁s", "▁su", "▁sub", "ub"]);
        let tok = tokenizer(&words);
        assert_eq!(pieces(&tok, "hello sub"), ["hello", "▁sub"]);
        assert_eq!(pieces(&tok, "hellos"), ["hello", "s"]);
    }

    #[test]
    fn score_order_differs_from_token_order() {
        let mut words = LETTERS.to_vec();
        words.extend(["cd", "ab", "bcd"]);
        let mut vocab = vocab_with(&normal(&words), true);
        // Score order: `cd` first, then `ab` and `bcd` tie on score; the longer right part wins.
        let n = vocab.tokens.len();
        vocab.scores[n - 3] = 0.0;
        vocab.scores[n - 2] = -1.0;
        vocab.scores[n - 1] = -1.0;
        let by_score = SpmTokenizer::with_merge_order(vocab.clone(), MergeOrder::Score).expect("valid");
        assert_eq!(pieces(&by_score, "abcd"), ["a", "bcd"]);
        let by_id = SpmTokenizer::new(vocab).expect("valid");
        assert_eq!(pieces(&by_id, "abcd"), ["ab", "cd"]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let tok = tokenizer(&LETTERS);
        let ids = tok.encode("aé", false);
        assert_eq!(ids.len(), 3);
        assert_eq!(tok.token_to_piece(ids[1]), Some("<0xC3>"));
        assert_eq!(tok.token_to_piece(ids[2]), Some("<0xA9>"));
        assert_eq!(tok.decode(&ids, false).expect("ids in range"), "aé");
        // Byte-fallback symbols never merge, even when the text would form a token.
        let mut words = LETTERS.to_vec();
        words.push("aé");
        let tok = tokenizer(&words);
        assert_eq!(tok.encode("aé", false).len(), 3);
    }

    #[test]
    fn unknown_token_when_there_are_no_byte_tokens() {
        let tok = SpmTokenizer::new(vocab_with(&normal(&LETTERS), false)).expect("valid");
        let ids = tok.encode("a☃☃b", false);
        assert_eq!(ids, [tok.id_of("a").unwrap(), 3, tok.id_of("b").unwrap()]);
    }

    #[test]
    fn special_tokens_in_text_are_single_ids() {
        let mut words = LETTERS.to_vec();
        words.extend(["us", "hi"]);
        let tok = tokenizer(&words);
        let ids = tok.encode("<start_of_turn>us\nhi<end_of_turn>", true);
        let expected = ["<bos>", "<start_of_turn>", "us", "\n", "hi", "<end_of_turn>"];
        assert_eq!(ids, expected.map(|p| tok.id_of(p).unwrap()));
        // Leftmost-longest: three newlines are `\n\n` then `\n`; `<b>` is user-defined.
        assert_eq!(pieces(&tok, "a\n\n\n<b>b"), ["a", "\n\n", "\n", "<b>", "b"]);
        // Unfinished specials are ordinary text.
        assert_eq!(pieces(&tok, "<b").len(), 2);
        assert!(tok.is_special(4) && tok.is_special(2) && !tok.is_special(6));
        assert!(!tok.is_special(u32::MAX));
    }

    /// Gemma 3's image markers are user-defined tokens in its GGUF (like `<b>` and `\n\n`, which
    /// are text), but its tokenizer.json marks them special: decoding with `skip_special` leaves
    /// them out and keeps the text-like ones.
    #[test]
    fn image_markers_are_special_and_other_user_defined_tokens_are_text() {
        let mut pieces = normal(&LETTERS);
        pieces.extend([
            ("[multimodal]", TYPE_USER_DEFINED),
            ("<start_of_image>", TYPE_USER_DEFINED),
            ("<end_of_image>", TYPE_USER_DEFINED),
        ]);
        let tok = SpmTokenizer::new(vocab_with(&pieces, true)).expect("valid");
        let id = |p: &str| tok.id_of(p).unwrap();
        let ids = [
            id("a"),
            id("<start_of_image>"),
            id("<b>"),
            id("\n\n"),
            id("[multimodal]"),
            id("<end_of_image>"),
            id("b"),
        ];
        assert_eq!(tok.decode(&ids, true).unwrap(), "a<b>\n\nb");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            "a<start_of_image><b>\n\n[multimodal]<end_of_image>b"
        );
        for marker in [
            "<start_of_image>",
            "<end_of_image>",
            "[multimodal]",
            "<end_of_turn>",
        ] {
            assert!(tok.is_special(id(marker)), "{marker}");
        }
        assert!(!tok.is_special(id("<b>")) && !tok.is_special(id("\n\n")));
        // Each token's bytes: a byte token's byte, `▁` as a space, a special token's spelling.
        assert_eq!(tok.token_bytes(id("<0xE6>")), Some(vec![0xE6]));
        assert_eq!(
            tok.token_bytes(id("<end_of_turn>")),
            Some(b"<end_of_turn>".to_vec())
        );
        assert_eq!(tok.token_bytes(u32::MAX), None);
    }

    #[test]
    fn whitespace_runs_are_respelled_merges() {
        let tok = tokenizer(&LETTERS);
        assert_eq!(tok.id_of("  "), Some(8));
        assert_eq!(tok.id_of("▁▁"), Some(8));
        assert_eq!(
            tok.encode("a  b", false),
            [tok.id_of("a").unwrap(), 8, tok.id_of("b").unwrap()]
        );
        assert_eq!(tok.encode("   ", false), [9]);
        // Pairs of `▁` form first (the lower id), leftmost first: ▁▁|▁▁|▁, then ▁▁|▁▁▁.
        assert_eq!(tok.encode("     ", false), [8, 9]);
        assert_eq!(tok.decode(&[8, 9], false).expect("in range"), "     ");
    }

    #[test]
    fn space_prefix_only_at_the_start_of_the_text() {
        let mut words = LETTERS.to_vec();
        words.extend(["▁a", "▁h", "▁hi", "hi"]);
        let mut vocab = vocab_with(&normal(&words), true);
        vocab.add_space_prefix = true;
        let tok = SpmTokenizer::new(vocab).expect("valid");
        assert_eq!(pieces(&tok, "hi a"), ["▁hi", "▁a"]);
        assert_eq!(pieces(&tok, "<start_of_turn>hi"), ["<start_of_turn>", "hi"]);
        assert!(tok.encode("", false).is_empty());
    }

    #[test]
    fn decode_round_trip_and_special_skipping() {
        let mut words = LETTERS.to_vec();
        words.extend(["he", "ll", "hell", "▁s"]);
        let tok = tokenizer(&words);
        for text in [
            "hello sub",
            " leading",
            "trailing  ",
            "tabs\tand\nlines\n\n",
            "日本 🤦🏼‍♂️ x",
        ] {
            let ids = tok.encode(text, true);
            assert_eq!(tok.decode(&ids, true).expect("in range"), text);
            assert_eq!(tok.decode(&ids, false).expect("in range"), format!("<bos>{text}"));
        }
        let ids = tok.encode("<start_of_turn>hi<end_of_turn>", false);
        assert_eq!(tok.decode(&ids, true).expect("in range"), "hi");
        // A lone byte of a multi-byte character decodes lossily.
        let lone = tok.id_of("<0xE6>").unwrap();
        assert_eq!(
            tok.decode(&[lone, tok.id_of("a").unwrap()], false)
                .expect("in range"),
            "\u{fffd}a"
        );
        match tok.decode(&[1_000_000], false) {
            Err(SpmError::IdOutOfRange { id: 1_000_000, .. }) => {}
            other => panic!("expected IdOutOfRange, got {other:?}"),
        }
    }

    #[test]
    fn invalid_vocabularies_are_rejected() {
        let good = vocab_with(&normal(&LETTERS), true);

        let mut v = good.clone();
        v.scores.pop();
        assert!(matches!(
            SpmTokenizer::new(v),
            Err(SpmError::LengthMismatch { .. })
        ));

        let mut v = good.clone();
        v.eos = Some(v.tokens.len() as u32);
        let err = SpmTokenizer::new(v).expect_err("eos out of range");
        assert!(
            matches!(err, SpmError::SpecialIdOutOfRange { role: "eos", .. }),
            "{err}"
        );

        let mut v = good.clone();
        let at = v.tokens.iter().position(|t| t == "<0x7F>").unwrap();
        v.tokens[at] = "x7F".into();
        v.types[at] = 1;
        let err = SpmTokenizer::new(v).expect_err("missing byte token");
        assert!(err.to_string().contains("<0x7F>"), "{err}");

        let mut v = vocab_with(&normal(&LETTERS), false);
        v.unk = None;
        assert!(matches!(SpmTokenizer::new(v), Err(SpmError::NoFallback)));

        let v = SpmVocab::default();
        assert!(matches!(SpmTokenizer::new(v), Err(SpmError::EmptyVocab)));
    }

    /// Compares with transformers on the real Gemma 3 270M vocabulary, when the model file is
    /// present (`TANDEM_GEMMA3_270M_GGUF`, default `~/.cache/tandem/gemma-3-270m-q4_k_m.gguf`).
    #[test]
    fn matches_transformers_on_gemma3_270m() {
        let path = match std::env::var_os("TANDEM_GEMMA3_270M_GGUF") {
            Some(p) => std::path::PathBuf::from(p),
            None => match std::env::var_os("HOME") {
                Some(home) => std::path::Path::new(&home).join(".cache/tandem/gemma-3-270m-q4_k_m.gguf"),
                None => return,
            },
        };
        if !path.exists() {
            eprintln!("skipped: {} not found", path.display());
            return;
        }
        let reference = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/gemma3-270m/reference.json"
        );
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(reference).expect("reference.json"))
                .expect("reference.json is JSON");

        let vocab = gguf_meta::read_vocab(&path);
        assert!(vocab.add_bos && !vocab.add_space_prefix);
        let tok = SpmTokenizer::new(vocab).expect("Gemma 3 vocabulary");
        assert_eq!(tok.vocab_size(), 262_144);
        // The image markers are user-defined there, and special (HTML tags are text).
        for (marker, special) in [
            ("<start_of_image>", true),
            ("<end_of_image>", true),
            ("<b>", false),
        ] {
            assert_eq!(tok.is_special(tok.id_of(marker).unwrap()), special, "{marker}");
        }

        let cases = reference["tokenization"].as_array().expect("tokenization array");
        assert!(cases.len() >= 30);
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().expect("text");
            let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
            let ids = tok.encode(text, tok.add_bos());
            if ids != expected {
                failures.push(format!("{text:?}:\n  ours {ids:?}\n  HF   {expected:?}"));
            }
            // transformers decodes a literal `▁` in the text as a space too.
            let decoded = format!("<bos>{}", text.replace(SPACE_MARK, " "));
            assert_eq!(tok.decode(&ids, false).expect("in range"), decoded);
        }
        for case in reference["greedy"].as_array().expect("greedy array") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let expected: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
            assert_eq!(tok.encode(prompt, true), expected, "{prompt:?}");
        }
        assert!(
            failures.is_empty(),
            "{} mismatches:\n{}",
            failures.len(),
            failures.join("\n")
        );

        // Speed: 10 KB of mixed text must take milliseconds, not seconds.
        let mut text = String::new();
        let mut k = 0;
        while text.len() < 10_000 {
            text.push_str(cases[k % cases.len()]["text"].as_str().expect("text"));
            k += 1;
        }
        let start = std::time::Instant::now();
        let ids = tok.encode(&text, true);
        let elapsed = start.elapsed();
        eprintln!(
            "encoded {} bytes into {} tokens in {elapsed:?}",
            text.len(),
            ids.len()
        );
        assert!(elapsed.as_secs_f64() < 1.0, "encoding 10 KB took {elapsed:?}");
    }

    /// Just enough of a GGUF reader to pull `tokenizer.ggml.*` out of a file.
    mod gguf_meta {
        use std::io::Read;

        use super::SpmVocab;

        enum Value {
            Int(i64),
            Float(f64),
            Bool(bool),
            Str(String),
            Array(Vec<Value>),
        }

        fn bytes<const N: usize>(r: &mut impl Read) -> [u8; N] {
            let mut b = [0u8; N];
            r.read_exact(&mut b).expect("GGUF truncated");
            b
        }

        fn u32_(r: &mut impl Read) -> u32 {
            u32::from_le_bytes(bytes(r))
        }

        fn u64_(r: &mut impl Read) -> u64 {
            u64::from_le_bytes(bytes(r))
        }

        fn string(r: &mut impl Read) -> String {
            let len = u64_(r) as usize;
            let mut b = vec![0u8; len];
            r.read_exact(&mut b).expect("GGUF truncated");
            String::from_utf8(b).expect("GGUF string is UTF-8")
        }

        fn value(r: &mut impl Read, kind: u32) -> Value {
            match kind {
                0 => Value::Int(i64::from(bytes::<1>(r)[0])),
                1 => Value::Int(i64::from(i8::from_le_bytes(bytes(r)))),
                2 => Value::Int(i64::from(u16::from_le_bytes(bytes(r)))),
                3 => Value::Int(i64::from(i16::from_le_bytes(bytes(r)))),
                4 => Value::Int(i64::from(u32_(r))),
                5 => Value::Int(i64::from(i32::from_le_bytes(bytes(r)))),
                6 => Value::Float(f64::from(f32::from_le_bytes(bytes(r)))),
                7 => Value::Bool(bytes::<1>(r)[0] != 0),
                8 => Value::Str(string(r)),
                9 => {
                    let inner = u32_(r);
                    let n = u64_(r);
                    Value::Array((0..n).map(|_| value(r, inner)).collect())
                }
                10 => Value::Int(u64_(r) as i64),
                11 => Value::Int(i64::from_le_bytes(bytes(r))),
                12 => Value::Float(f64::from_le_bytes(bytes(r))),
                other => panic!("unknown GGUF value type {other}"),
            }
        }

        pub(super) fn read_vocab(path: &std::path::Path) -> SpmVocab {
            let file = std::fs::File::open(path).expect("open GGUF");
            let mut r = std::io::BufReader::with_capacity(1 << 20, file);
            assert_eq!(&bytes::<4>(&mut r), b"GGUF");
            let _version = u32_(&mut r);
            let _tensors = u64_(&mut r);
            let kvs = u64_(&mut r);
            let mut vocab = SpmVocab::default();
            for _ in 0..kvs {
                let key = string(&mut r);
                let kind = u32_(&mut r);
                let v = value(&mut r, kind);
                let int = |v: &Value| match v {
                    Value::Int(i) => *i,
                    _ => panic!("{key}: expected an integer"),
                };
                match (key.as_str(), &v) {
                    ("tokenizer.ggml.tokens", Value::Array(a)) => {
                        vocab.tokens = a
                            .iter()
                            .map(|t| match t {
                                Value::Str(s) => s.clone(),
                                _ => panic!("token is not a string"),
                            })
                            .collect()
                    }
                    ("tokenizer.ggml.scores", Value::Array(a)) => {
                        vocab.scores = a
                            .iter()
                            .map(|t| match t {
                                Value::Float(f) => *f as f32,
                                _ => panic!("score is not a float"),
                            })
                            .collect()
                    }
                    ("tokenizer.ggml.token_type", Value::Array(a)) => {
                        vocab.types = a.iter().map(|t| int(t) as i32).collect()
                    }
                    ("tokenizer.ggml.bos_token_id", v) => vocab.bos = Some(int(v) as u32),
                    ("tokenizer.ggml.eos_token_id", v) => vocab.eos = Some(int(v) as u32),
                    ("tokenizer.ggml.unknown_token_id", v) => vocab.unk = Some(int(v) as u32),
                    ("tokenizer.ggml.add_bos_token", Value::Bool(b)) => vocab.add_bos = *b,
                    ("tokenizer.ggml.add_space_prefix", Value::Bool(b)) => vocab.add_space_prefix = *b,
                    _ => {}
                }
            }
            vocab
        }
    }
}
