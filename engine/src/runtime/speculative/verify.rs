//! The acceptance rule: whether the target keeps a draft token, and what it emits instead.
//!
//! Greedy: the target's pick (its sampler over the row, the repetition penalty included) is
//! the token; the draft token is kept when they agree, so the output is what plain greedy
//! decoding gives, token for token.
//!
//! Sampled: the standard rejection rule (Leviathan et al., Chen et al. 2023). With `p` the
//! target's distribution for the row (after every warper, [`Sampler::distribution`]) and `q` the
//! draft's for the drafted position, the draft token `x` is kept with probability
//! `min(1, p(x) / q(x))`; on a rejection the token is drawn from `max(0, p - q)`, renormalised.
//! The emitted token is then distributed exactly as `p`. A deterministic draft (n-gram lookup)
//! has `q` a point mass at `x`: `x` is kept with probability `p(x)`, else the token comes from
//! `p` without `x`. The random numbers are the request's own sampler's (its seed).

use crate::runtime::sampler::Sampler;

/// Scratch for [`judge`]: the target's distribution and the residual one.
#[derive(Default)]
pub struct Scratch {
    p: Vec<(u32, f64)>,
    residual: Vec<(u32, f64)>,
}

/// The token the target emits at a drafted position whose logits are `row`, and whether it is
/// the draft token `draft` (kept). `q`: the distribution the draft drew `draft` from; `None`
/// for a deterministic draft. `history`: the ids before this position (the repetition
/// penalty reads them). `row` is scratch.
pub fn judge(
    sampler: &mut Sampler,
    row: &mut [f32],
    history: &[u32],
    draft: u32,
    q: Option<&[(u32, f64)]>,
    scratch: &mut Scratch,
) -> (u32, bool) {
    if sampler.config().temperature == 0.0 {
        let id = sampler.sample(row, history);
        return (id, id == draft);
    }
    let Scratch { p, residual } = scratch;
    sampler.distribution(row, history, p);
    let prob = |d: &[(u32, f64)], id: u32| d.iter().find(|&&(t, _)| t == id).map_or(0.0, |&(_, w)| w);
    let px = prob(p, draft);
    let qx = q.map_or(1.0, |q| prob(q, draft));
    // A draft token the draft could not have drawn (q(x) = 0) is never kept.
    let keep = qx > 0.0 && sampler.uniform() < (px / qx).min(1.0);
    if keep {
        return (draft, true);
    }
    residual.clear();
    residual.extend(p.iter().map(|&(id, w)| {
        let qw = match q {
            Some(q) => prob(q, id),
            None if id == draft => w,
            None => 0.0,
        };
        (id, (w - qw).max(0.0))
    }));
    // p = q exactly leaves nothing (and a rejection was then impossible but for rounding):
    // the target's own distribution.
    let id = if residual.iter().any(|&(_, w)| w > 0.0) {
        sampler.draw_from(residual)
    } else {
        sampler.draw_from(p)
    };
    (id, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::sampler::SamplerConfig;

    fn sampler(temperature: f32, seed: u64) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed,
        })
        .unwrap()
    }

    fn logits(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| (x as f32).ln()).collect()
    }

    /// Pearson's chi-square statistic of `counts` against `n * p`.
    fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| {
                let e = n as f64 * pi;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    // The 0.999 quantile of chi-square with 3 degrees of freedom: a correct rule fails one run in
    // a thousand, and the seeds are fixed, so the test is deterministic.
    const CHI2_3_999: f64 = 16.266;

    #[test]
    fn greedy_keeps_the_draft_only_where_it_is_the_argmax() {
        let mut s = sampler(0.0, 0);
        let mut scratch = Scratch::default();
        let row = logits(&[0.1, 0.6, 0.2, 0.1]);
        assert_eq!(
            judge(&mut s, &mut row.clone(), &[], 1, None, &mut scratch),
            (1, true)
        );
        assert_eq!(
            judge(&mut s, &mut row.clone(), &[], 2, None, &mut scratch),
            (1, false)
        );
    }

    #[test]
    fn emitted_tokens_follow_the_target_for_a_sampled_draft() {
        let p = [0.1, 0.4, 0.3, 0.2];
        let q = [0.4, 0.1, 0.25, 0.25];
        let qd: Vec<(u32, f64)> = q.iter().enumerate().map(|(i, &w)| (i as u32, w)).collect();
        let mut counts = [0u64; 4];
        let mut kept = 0u64;
        let mut scratch = Scratch::default();
        let mut draw = sampler(1.0, 7);
        let mut target = sampler(1.0, 11);
        let n = 40_000;
        for _ in 0..n {
            let x = draw.draw_from(&qd);
            let (id, keep) = judge(&mut target, &mut logits(&p), &[], x, Some(&qd), &mut scratch);
            counts[id as usize] += 1;
            kept += u64::from(keep);
        }
        let chi = chi_square(&counts, &p);
        assert!(chi < CHI2_3_999, "chi-square {chi} for {counts:?}");
        // Acceptance is sum(min(p, q)) = 0.1 + 0.1 + 0.25 + 0.2 = 0.65.
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.65).abs() < 0.01, "acceptance {rate}");
        // The draft's own distribution is far from p: a rule that kept every draft would fail.
        assert!(chi_square(&[16_000, 4_000, 10_000, 10_000], &p) > CHI2_3_999);
    }

    #[test]
    fn emitted_tokens_follow_the_target_for_a_deterministic_draft() {
        let p = [0.1, 0.4, 0.3, 0.2];
        let mut counts = [0u64; 4];
        let mut scratch = Scratch::default();
        let mut target = sampler(1.0, 3);
        for i in 0..40_000u32 {
            // The draft cycles through every token, the improbable one most often.
            let x = [0, 0, 2, 3][(i % 4) as usize];
            let (id, keep) = judge(&mut target, &mut logits(&p), &[], x, None, &mut scratch);
            assert!(!keep || id == x);
            counts[id as usize] += 1;
        }
        let chi = chi_square(&counts, &p);
        assert!(chi < CHI2_3_999, "chi-square {chi} for {counts:?}");
    }

    #[test]
    fn a_token_the_draft_could_not_draw_is_rejected() {
        let mut s = sampler(1.0, 0);
        let mut scratch = Scratch::default();
        let q = [(0u32, 1.0)];
        for _ in 0..100 {
            let (id, keep) = judge(&mut s, &mut logits(&[0.5, 0.5]), &[], 1, Some(&q), &mut scratch);
            assert!(!keep);
            // max(0, p - q) leaves token 1 alone.
            assert_eq!(id, 1);
        }
    }
}
