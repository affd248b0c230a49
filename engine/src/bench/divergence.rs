//! How far one run's next-token distributions are from a reference run's, as llama.cpp's
//! `llama-perplexity --kl-divergence` reports it: the reference run saves, per scored token, its
//! negative log-likelihood and its `k` most likely tokens with their log-probabilities (a
//! [`Reference`] file); a later run over the same tokens compares its own distributions with
//! them ([`kl_top_k`]) and [`summarize`]s: mean, median, 99th percentile and largest KL
//! divergence, how often both runs' most likely tokens agree, and both perplexities with the
//! ratio's error bar.
//!
//! Only the top `k` of the reference are kept, so the divergence is computed over those `k`
//! tokens and one more outcome, "any other token", holding the rest of each distribution's
//! mass. Merging outcomes never increases a KL divergence, so this is a lower bound of the full
//! one, equal to it where the reference puts all its mass on its top `k`.
//!
//! The file: the 8-byte magic `TNDKLD01`, then little-endian `u32` vocabulary, `u32` k, `u32`
//! tokens per chunk, `u32` chunks, `u64` hash of every token id of the text's chunks (FNV-1a over
//! their little-endian bytes), `u64` scored tokens; then per scored token an `f64` negative
//! log-likelihood and `k` pairs of `u32` token id and `f32` log-probability, most likely first.

use std::io::{Read, Write};

use crate::runtime::sampler::LogSoftmax;
use std::path::{Path, PathBuf};

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"TNDKLD01";

/// A reference file that cannot be read or does not match the run.
#[derive(Debug, thiserror::Error)]
pub enum DivergenceError {
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not start with [`MAGIC`].
    #[error("{}: not a KL-divergence reference (no {:?} magic): write one with --kl-divergence-base", path.display(), std::str::from_utf8(MAGIC).unwrap_or("?"))]
    NotAReference {
        /// The file.
        path: PathBuf,
    },
    /// The file ends before its last record.
    #[error("{}: truncated at scored token {token} of {count}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The record that is missing.
        token: u64,
        /// The records the header promises.
        count: u64,
    },
    /// A header field differs from this run's.
    #[error("{}: the reference's {field} is {file}, this run's {run}: compare runs over the same model, text, --ctx-size and --chunks", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The header field.
        field: &'static str,
        /// The file's value.
        file: u64,
        /// This run's value.
        run: u64,
    },
    /// The header's k is 0 or larger than the vocabulary.
    #[error("{}: top-k {k} is not within 1..={vocab}", path.display())]
    BadTopK {
        /// The file.
        path: PathBuf,
        /// The header's k.
        k: u32,
        /// The header's vocabulary.
        vocab: u32,
    },
}

/// What a reference file says of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The vocabulary (logits per token).
    pub vocab: u32,
    /// Tokens kept per scored token.
    pub top_k: u32,
    /// Tokens per chunk (`--ctx-size`).
    pub ctx_size: u32,
    /// Chunks scored.
    pub chunks: u32,
    /// [`token_hash`] of the chunks' token ids.
    pub tokens_hash: u64,
    /// Scored tokens (records).
    pub count: u64,
}

/// FNV-1a over the little-endian bytes of `ids`: which text (and tokenizer) a reference was made on.
pub fn token_hash(ids: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// One scored token of a run: the negative log-likelihood of `target` under the logits `row`,
/// and the `k` most likely tokens with their log-probabilities, most likely first (ties: the
/// lower id first); the log-softmax is the sampler's, as for `logprobs`.
pub fn score(row: &[f32], target: usize, k: usize) -> (f64, Vec<(u32, f32)>) {
    let norm = LogSoftmax::of(row);
    let nll = -row.get(target).map_or(f64::NEG_INFINITY, |&l| norm.of_logit(l));
    let top = norm
        .top(row, k, &mut Vec::new())
        .into_iter()
        .map(|(id, lp)| (id, lp as f32))
        .collect();
    (nll, top)
}

/// The KL divergence D(reference || run) over the reference's `top` tokens (log-probabilities)
/// and "any other token", with the run's logits `row`; and whether the run's most likely token is
/// the reference's.
pub fn kl_top_k(top: &[(u32, f32)], row: &[f32]) -> (f64, bool) {
    let norm = LogSoftmax::of(row);
    let (mut kl, mut p_sum, mut q_sum) = (0.0f64, 0.0f64, 0.0f64);
    for &(id, lp) in top {
        let lp = lp as f64;
        // Rounded to f32 as the reference's are, so that a run equal to the reference is 0.
        let lq = row
            .get(id as usize)
            .map_or(f64::NEG_INFINITY, |&v| norm.of_logit(v) as f32 as f64);
        let p = lp.exp();
        p_sum += p;
        q_sum += lq.exp();
        if p > 0.0 {
            kl += p * (lp - lq);
        }
    }
    // "Any other token": below REST_FLOOR the remainder is the rounding of the stored f32
    // log-probabilities, not mass (a reference that kept every token).
    let p_rest = 1.0 - p_sum;
    if p_rest > REST_FLOOR {
        let q_rest = (1.0 - q_sum).max(f64::MIN_POSITIVE);
        kl += p_rest * (p_rest.ln() - q_rest.ln());
    }
    let argmax = row
        .iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |best, (i, v)| {
            if *v > best.1 {
                (i, *v)
            } else {
                best
            }
        })
        .0;
    let same_top = top.first().is_some_and(|(id, _)| *id as usize == argmax);
    (kl.max(0.0), same_top)
}

/// The smallest remainder of a reference distribution outside its top k counted as an outcome.
const REST_FLOOR: f64 = 1e-6;

/// A reference file being written.
pub struct ReferenceWriter {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    k: usize,
}

impl ReferenceWriter {
    /// Creates `path` with `header`.
    pub fn create(path: &Path, header: &Header) -> Result<Self, DivergenceError> {
        let io = |source| DivergenceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let mut head = Vec::with_capacity(40);
        head.extend_from_slice(MAGIC);
        for v in [header.vocab, header.top_k, header.ctx_size, header.chunks] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        head.extend_from_slice(&header.tokens_hash.to_le_bytes());
        head.extend_from_slice(&header.count.to_le_bytes());
        out.write_all(&head).map_err(io)?;
        Ok(ReferenceWriter {
            path: path.to_path_buf(),
            out,
            k: header.top_k as usize,
        })
    }

    /// Appends one scored token (`top` holds at most k entries; fewer are padded with id 0 at
    /// log-probability -inf).
    pub fn push(&mut self, nll: f64, top: &[(u32, f32)]) -> Result<(), DivergenceError> {
        let mut rec = Vec::with_capacity(8 + 8 * self.k);
        rec.extend_from_slice(&nll.to_le_bytes());
        for i in 0..self.k {
            let (id, lp) = top.get(i).copied().unwrap_or((0, f32::NEG_INFINITY));
            rec.extend_from_slice(&id.to_le_bytes());
            rec.extend_from_slice(&lp.to_le_bytes());
        }
        self.out.write_all(&rec).map_err(|source| DivergenceError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<(), DivergenceError> {
        self.out.flush().map_err(|source| DivergenceError::Io {
            path: self.path,
            source,
        })
    }
}

/// A reference file being read.
pub struct Reference {
    path: PathBuf,
    input: std::io::BufReader<std::fs::File>,
    /// Its header.
    pub header: Header,
    read: u64,
}

impl Reference {
    /// Opens `path` and reads its header.
    pub fn open(path: &Path) -> Result<Self, DivergenceError> {
        let io = |source| DivergenceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut input = std::io::BufReader::new(file);
        let mut head = [0u8; 40];
        if let Err(e) = input.read_exact(&mut head) {
            return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                DivergenceError::NotAReference {
                    path: path.to_path_buf(),
                }
            } else {
                io(e)
            });
        }
        if &head[..8] != MAGIC {
            return Err(DivergenceError::NotAReference {
                path: path.to_path_buf(),
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let header = Header {
            vocab: u32_at(8),
            top_k: u32_at(12),
            ctx_size: u32_at(16),
            chunks: u32_at(20),
            tokens_hash: u64_at(24),
            count: u64_at(32),
        };
        if header.top_k == 0 || header.top_k > header.vocab {
            return Err(DivergenceError::BadTopK {
                path: path.to_path_buf(),
                k: header.top_k,
                vocab: header.vocab,
            });
        }
        Ok(Reference {
            path: path.to_path_buf(),
            input,
            header,
            read: 0,
        })
    }

    /// Checks that the header's field `field` is `run`'s.
    pub fn expect(&self, field: &'static str, file: u64, run: u64) -> Result<(), DivergenceError> {
        if file == run {
            Ok(())
        } else {
            Err(DivergenceError::Mismatch {
                path: self.path.clone(),
                field,
                file,
                run,
            })
        }
    }

    /// The next scored token: its negative log-likelihood and top k (entries at -inf dropped).
    pub fn next_token(&mut self) -> Result<(f64, Vec<(u32, f32)>), DivergenceError> {
        let k = self.header.top_k as usize;
        let mut rec = vec![0u8; 8 + 8 * k];
        if let Err(e) = self.input.read_exact(&mut rec) {
            return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                DivergenceError::Truncated {
                    path: self.path.clone(),
                    token: self.read,
                    count: self.header.count,
                }
            } else {
                DivergenceError::Io {
                    path: self.path.clone(),
                    source: e,
                }
            });
        }
        self.read += 1;
        let mut b8 = [0u8; 8];
        b8.copy_from_slice(&rec[..8]);
        let nll = f64::from_le_bytes(b8);
        let top = rec[8..]
            .chunks_exact(8)
            .map(|c| {
                (
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .filter(|(_, lp)| lp.is_finite())
            .collect();
        Ok((nll, top))
    }
}

/// A comparison's statistics.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Divergence {
    /// Scored tokens.
    pub tokens: usize,
    /// Mean KL divergence (nats) and its standard error.
    pub kl_mean: f64,
    /// Standard error of [`Divergence::kl_mean`].
    pub kl_mean_error: f64,
    /// Median KL divergence.
    pub kl_median: f64,
    /// 99th percentile KL divergence.
    pub kl_p99: f64,
    /// Largest KL divergence.
    pub kl_max: f64,
    /// Fraction of tokens whose most likely token is the same in both runs.
    pub same_top: f64,
    /// Standard error of [`Divergence::same_top`].
    pub same_top_error: f64,
    /// The reference run's perplexity.
    pub ppl_reference: f64,
    /// This run's perplexity.
    pub ppl: f64,
    /// Mean of ln(PPL / PPL(reference)) over the tokens (the mean difference of their negative
    /// log-likelihoods).
    pub ln_ppl_ratio: f64,
    /// Standard error of [`Divergence::ln_ppl_ratio`].
    pub ln_ppl_ratio_error: f64,
}

/// The statistics of per-token KL divergences `kl`, top-token agreements `same` (a count), and the
/// negative log-likelihoods of the reference (`nll_ref`) and this run (`nll`), token for token.
pub fn summarize(kl: &[f64], same: usize, nll_ref: &[f64], nll: &[f64]) -> Divergence {
    let n = kl.len();
    let nf = n.max(1) as f64;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let stderr = |v: &[f64], m: f64| {
        if v.len() < 2 {
            0.0
        } else {
            (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / ((v.len() - 1) as f64 * v.len() as f64))
                .sqrt()
        }
    };
    let mut sorted = kl.to_vec();
    sorted.sort_by(f64::total_cmp);
    // The value below which a fraction q of the tokens fall (nearest rank).
    let rank = |q: f64| -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        sorted[i]
    };
    let kl_mean = mean(kl);
    let diffs: Vec<f64> = nll.iter().zip(nll_ref).map(|(a, b)| a - b).collect();
    let ln_ppl_ratio = mean(&diffs);
    let same_top = same as f64 / nf;
    Divergence {
        tokens: n,
        kl_mean,
        kl_mean_error: stderr(kl, kl_mean),
        kl_median: rank(0.5),
        kl_p99: rank(0.99),
        kl_max: sorted.last().copied().unwrap_or(0.0),
        same_top,
        same_top_error: (same_top * (1.0 - same_top) / nf).sqrt(),
        ppl_reference: mean(nll_ref).exp(),
        ppl: mean(nll).exp(),
        ln_ppl_ratio,
        ln_ppl_ratio_error: stderr(&diffs, ln_ppl_ratio),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_computed_divergence() {
        // Reference distribution (0.5, 0.25, 0.25) over 3 tokens, run (0.25, 0.25, 0.5):
        // KL = 0.5 ln 2 + 0.25 ln 1 + 0.25 ln 0.5 = 0.25 ln 2.
        let p = [0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
        let q = [0.25f32.ln(), 0.25f32.ln(), 0.5f32.ln()];
        let (nll, top) = score(&p, 2, 3);
        assert!((nll - 4f64.ln()).abs() < 1e-6, "{nll}");
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        let (kl, same) = kl_top_k(&top, &q);
        assert!((kl - 0.25 * 2f64.ln()).abs() < 1e-6, "{kl}");
        assert!(!same, "the run's top token is 2, the reference's 0");
        // Kept top 1 only: outcomes {0} and {1, 2}: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75).
        let (_, top1) = score(&p, 0, 1);
        let (kl1, _) = kl_top_k(&top1, &q);
        let want = 0.5 * 2f64.ln() + 0.5 * (0.5f64 / 0.75).ln();
        assert!((kl1 - want).abs() < 1e-6, "{kl1} vs {want}");
        assert!(kl1 <= kl + 1e-12, "a merged divergence is a lower bound");
        // The same distribution (shifted logits): zero, same top.
        let shifted: Vec<f32> = p.iter().map(|v| v + 3.0).collect();
        let (kl0, same0) = kl_top_k(&top, &shifted);
        assert!(kl0.abs() < 1e-6 && same0, "{kl0}");
    }

    #[test]
    fn summaries_count_ranks_and_errors() {
        let kl = [0.0, 0.1, 0.2, 0.3];
        let d = summarize(&kl, 3, &[1.0, 1.0, 1.0, 1.0], &[1.0, 1.2, 1.0, 1.2]);
        assert_eq!(d.tokens, 4);
        assert!((d.kl_mean - 0.15).abs() < 1e-12);
        assert_eq!((d.kl_median, d.kl_p99, d.kl_max), (0.1, 0.3, 0.3));
        assert!((d.same_top - 0.75).abs() < 1e-12);
        assert!((d.ln_ppl_ratio - 0.1).abs() < 1e-12);
        assert!((d.ppl_reference - 1f64.exp()).abs() < 1e-12);
        // Standard error of (0, 0.2, 0, 0.2): sd 0.11547 / 2.
        assert!(
            (d.ln_ppl_ratio_error - 0.057735).abs() < 1e-5,
            "{}",
            d.ln_ppl_ratio_error
        );
    }

    #[test]
    fn files_round_trip_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ref.kld");
        let header = Header {
            vocab: 5,
            top_k: 2,
            ctx_size: 8,
            chunks: 1,
            tokens_hash: token_hash(&[1, 2, 3]),
            count: 2,
        };
        let mut w = ReferenceWriter::create(&path, &header).unwrap();
        w.push(1.5, &[(3, -0.1), (1, -2.5)]).unwrap();
        w.push(0.5, &[(4, -0.2)]).unwrap();
        w.finish().unwrap();
        let mut r = Reference::open(&path).unwrap();
        assert_eq!(r.header, header);
        assert_eq!(r.next_token().unwrap(), (1.5, vec![(3, -0.1), (1, -2.5)]));
        assert_eq!(r.next_token().unwrap(), (0.5, vec![(4, -0.2)]));
        let e = r.next_token().unwrap_err().to_string();
        assert!(
            e.contains("ref.kld") && e.contains("truncated at scored token 2 of 2"),
            "{e}"
        );
        assert!(r
            .expect("vocabulary", 5, 6)
            .unwrap_err()
            .to_string()
            .contains("vocabulary is 5, this run's 6"));
        std::fs::write(&path, b"not a reference at all, but long enough to be read").unwrap();
        let e = Reference::open(&path).err().unwrap().to_string();
        assert!(e.contains("not a KL-divergence reference"), "{e}");
        assert_ne!(token_hash(&[1, 2, 3]), token_hash(&[1, 2, 4]));
    }
}
