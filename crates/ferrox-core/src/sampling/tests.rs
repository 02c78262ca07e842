//! Expected values here are computed by hand (or by std's f64 math in the
//! test), never by the sampler.

use super::rng::{splitmix64, Xoshiro256};
use super::*;

/// Temperature 1, every truncation and penalty off, fixed seed; `f` turns on
/// the one thing a test looks at.
fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        typical_p: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    };
    f(&mut p);
    p
}

/// The ids the truncation samplers keep, ascending.
fn kept(p: SamplingParams, logits: &[f32]) -> Vec<u32> {
    let mut s = Sampler::new(p, logits.len()).unwrap();
    s.truncate(logits).unwrap();
    let mut ids: Vec<u32> = s.cands.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids
}

fn ln(ps: &[f64]) -> Vec<f32> {
    ps.iter().map(|p| p.ln() as f32).collect()
}

fn sample_once(
    p: SamplingParams,
    logits: &[f32],
    history: &[u32],
) -> Result<Sampled, SamplingError> {
    let mut s = Sampler::new(p, logits.len())?;
    s.sample(&mut logits.to_vec(), history)
}

fn counts(p: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut s = Sampler::new(p, logits.len()).unwrap();
    let mut c = vec![0; logits.len()];
    let mut buf = logits.to_vec();
    for _ in 0..draws {
        buf.copy_from_slice(logits);
        c[s.sample(&mut buf, &[]).unwrap().token as usize] += 1;
    }
    c
}

#[test]
fn llama_cpp_defaults_are_the_default_params() {
    let d = SamplingParams::default();
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p, d.typical_p),
        (0.8, 40, 0.95, 0.05, 1.0)
    );
    assert_eq!(
        (
            d.repeat_penalty,
            d.repeat_last_n,
            d.presence_penalty,
            d.frequency_penalty
        ),
        (1.0, 64, 0.0, 0.0)
    );
    assert_eq!((d.seed, d.top_logprobs, d.logit_bias.len()), (None, 0, 0));
}

#[test]
fn greedy_takes_the_argmax_and_the_lowest_id_on_a_tie() {
    let g = SamplingParams::greedy();
    assert_eq!(
        sample_once(g.clone(), &[0.5, 3.0, -1.0, 2.9], &[])
            .unwrap()
            .token,
        1
    );
    assert_eq!(
        sample_once(g.clone(), &[1.0, 3.0, 2.0, 3.0, 3.0], &[])
            .unwrap()
            .token,
        1
    );
    assert_eq!(sample_once(g.clone(), &[-2.0, -2.0], &[]).unwrap().token, 0);
    // Long enough for the vectorized paths: maximum tied at ids 517 and 903.
    let mut long: Vec<f32> = (0..1000).map(|i| ((i * 31) % 97) as f32 * 0.01).collect();
    long[517] = 5.0;
    long[903] = 5.0;
    assert_eq!(sample_once(g.clone(), &long, &[]).unwrap().token, 517);
    // A negative temperature means greedy, as in llama.cpp.
    let neg = SamplingParams {
        temperature: -1.0,
        ..SamplingParams::default()
    };
    for seed in 0..20 {
        let p = SamplingParams {
            seed: Some(seed),
            ..neg.clone()
        };
        assert_eq!(sample_once(p, &[0.0, 1.0, 1.0, 0.9], &[]).unwrap().token, 1);
    }
}

#[test]
fn top_k_of_one_is_greedy_at_any_temperature() {
    let mut x = 12345u64;
    for case in 0..200 {
        let n = 3 + case % 50;
        // Coarse values so ties happen often.
        let logits: Vec<f32> = (0..n)
            .map(|_| (splitmix64(&mut x) % 8) as f32 - 4.0)
            .collect();
        let want = {
            let mut best = 0;
            for i in 0..n {
                if logits[i] > logits[best] {
                    best = i;
                }
            }
            best as u32
        };
        for t in [0.01, 0.5, 1.0, 5.0, 100.0] {
            let p = params(|p| {
                p.top_k = 1;
                p.temperature = t;
                p.seed = Some(case as u64);
            });
            assert_eq!(
                sample_once(p, &logits, &[]).unwrap().token,
                want,
                "case {case}, T {t}, {logits:?}"
            );
        }
    }
}

#[test]
fn top_k_keeps_the_k_highest_logits_and_breaks_ties_toward_lower_ids() {
    let logits = [0.5, 2.0, -1.0, 3.0, 2.0, 1.0];
    assert_eq!(kept(params(|p| p.top_k = 3), &logits), [1, 3, 4]);
    assert_eq!(kept(params(|p| p.top_k = 2), &logits), [1, 3]);
    assert_eq!(kept(params(|p| p.top_k = 6), &logits), [0, 1, 2, 3, 4, 5]);
    assert_eq!(kept(params(|p| p.top_k = 60), &logits), [0, 1, 2, 3, 4, 5]);
    // Banned tokens are not candidates even when k would reach them.
    assert_eq!(
        kept(params(|p| p.top_k = 5), &[1.0, f32::NEG_INFINITY, 2.0]),
        [0, 2]
    );
}

#[test]
fn top_k_above_the_heap_limit_keeps_the_k_highest_logits() {
    // logits[i] = (i * 7919) mod 5000 is a permutation of 0..5000 (7919 is
    // prime, coprime to 5000), so the top 2000 are exactly the ids whose
    // value is >= 3000.
    let logits: Vec<f32> = (0..5000u32).map(|i| ((i * 7919) % 5000) as f32).collect();
    let want: Vec<u32> = (0..5000u32).filter(|i| (i * 7919) % 5000 >= 3000).collect();
    assert_eq!(want.len(), 2000);
    assert_eq!(kept(params(|p| p.top_k = 2000), &logits), want);
    let want_heap: Vec<u32> = (0..5000u32).filter(|i| (i * 7919) % 5000 >= 4900).collect();
    assert_eq!(kept(params(|p| p.top_k = 100), &logits), want_heap);
}

#[test]
fn top_p_keeps_the_smallest_likeliest_set_reaching_p() {
    // Probabilities by id: 0.15, 0.50, 0.10, 0.25. Ranked: 1 (0.5), 3 (0.75), 0 (0.9), 2 (1.0).
    let logits = ln(&[0.15, 0.50, 0.10, 0.25]);
    assert_eq!(kept(params(|p| p.top_p = 0.4), &logits), [1]);
    assert_eq!(kept(params(|p| p.top_p = 0.7), &logits), [1, 3]);
    assert_eq!(kept(params(|p| p.top_p = 0.8), &logits), [0, 1, 3]);
    assert_eq!(kept(params(|p| p.top_p = 0.95), &logits), [0, 1, 2, 3]);
}

#[test]
fn top_p_past_the_partial_sort_keeps_the_lowest_ids_of_a_flat_distribution() {
    // 2000 equal logits: 1/2000 each. Reaching 0.2502 takes 501 tokens
    // (500 give 0.25) — more than the 256 sorted first — and ties go to lower ids.
    let logits = vec![0.0f32; 2000];
    let want: Vec<u32> = (0..501).collect();
    assert_eq!(kept(params(|p| p.top_p = 0.2502), &logits), want);
}

#[test]
fn min_p_keeps_tokens_at_least_min_p_times_the_likeliest() {
    // p = 0.40, 0.30, 0.02, 0.20, 0.08; min_p 0.1 → floor 0.04; 0.25 → floor 0.10.
    let logits = ln(&[0.40, 0.30, 0.02, 0.20, 0.08]);
    assert_eq!(kept(params(|p| p.min_p = 0.1), &logits), [0, 1, 3, 4]);
    assert_eq!(kept(params(|p| p.min_p = 0.25), &logits), [0, 1, 3]);
    assert_eq!(kept(params(|p| p.min_p = 0.9), &logits), [0]);
}

#[test]
fn typical_p_keeps_the_tokens_whose_surprise_is_closest_to_the_entropy() {
    // p by id: 0.2, 0.5, 0.1, 0.2. Entropy H = -(0.5 ln 0.5 + 2·0.2 ln 0.2 + 0.1 ln 0.1)
    // = 0.34657 + 0.64378 + 0.23026 = 1.22061. Surprise -ln p: 0.5 → 0.69315,
    // 0.2 → 1.60944, 0.1 → 2.30259; |surprise - H|: 0.5 → 0.52746, 0.2 → 0.38883,
    // 0.1 → 1.08198. Order: ids 0, 3 (0.2 each; cum 0.2, 0.4), 1 (cum 0.9), 2 (1.0).
    // Kept: the shortest prefix whose mass exceeds typical_p.
    let logits = ln(&[0.2, 0.5, 0.1, 0.2]);
    assert_eq!(kept(params(|p| p.typical_p = 0.3), &logits), [0, 3]);
    assert_eq!(kept(params(|p| p.typical_p = 0.5), &logits), [0, 1, 3]);
    assert_eq!(kept(params(|p| p.typical_p = 0.95), &logits), [0, 1, 2, 3]);
}

#[test]
fn truncation_runs_before_temperature() {
    // min_p 0.5 on p = 0.5, 0.3, 0.2 keeps ids 0 and 1 (0.2 < 0.25). Had the
    // temperature of 10 flattened the logits first, id 2 would pass (ratio ≈ 0.91).
    let logits = ln(&[0.5, 0.3, 0.2]);
    let c = counts(
        params(|p| {
            p.min_p = 0.5;
            p.temperature = 10.0;
        }),
        &logits,
        4000,
    );
    assert_eq!(c[2], 0, "{c:?}");
    assert!(c[0] > 1000 && c[1] > 1000, "{c:?}");
}

#[test]
fn penalties_follow_llama_cpp_and_openai_over_the_last_n_tokens() {
    let p = params(|p| {
        p.repeat_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
        p.repeat_last_n = 4;
    });
    let mut s = Sampler::new(p, 5).unwrap();
    let mut logits = [2.0, -1.0, 0.5, 3.0, 1.0];
    // The window is the last 4: [1, 3, 0, 0]; the leading 0 and 4 are outside it.
    let history = [4, 0, 1, 3, 0, 0];
    s.adjust(&mut logits, &history[2..]);
    // id 0: 2 / 2 - (2·0.25 + 0.5) = 0;  id 1: -1 · 2 - (0.25 + 0.5) = -2.75;
    // id 3: 3 / 2 - 0.75 = 0.75;  ids 2 and 4 untouched.
    assert_eq!(logits, [0.0, -2.75, 0.5, 0.75, 1.0]);
    // Through `sample`: the same window is found from the full history.
    let g = SamplingParams {
        temperature: 0.0,
        ..s.params().clone()
    };
    assert_eq!(
        sample_once(g, &[2.0, -1.0, 0.5, 3.0, 2.5], &history)
            .unwrap()
            .token,
        4
    );
}

#[test]
fn penalties_off_leave_logits_alone_and_skip_the_history_check() {
    let p = params(|p| p.repeat_last_n = 0);
    let mut s = Sampler::new(p.clone(), 3).unwrap();
    let mut logits = [1.0, 2.0, 3.0];
    // Token 99 is outside the vocabulary, but no penalty reads the history.
    s.sample(&mut logits, &[99, 2, 2]).unwrap();
    let on = params(|p| p.presence_penalty = 1.0);
    let err = sample_once(on, &[1.0, 2.0, 3.0], &[2, 99, 2]).unwrap_err();
    assert!(
        matches!(
            err,
            SamplingError::HistoryTokenOutOfRange {
                position: 1,
                token: 99,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn logit_bias_adds_and_negative_infinity_bans() {
    let logits = [1.0, 2.0, 5.0, 0.0];
    let ban = params(|p| p.logit_bias = vec![(2, f32::NEG_INFINITY)]);
    let c = counts(ban.clone(), &logits, 3000);
    assert_eq!(c[2], 0, "{c:?}");
    assert!(c[0] > 0 && c[1] > 0 && c[3] > 0, "{c:?}");
    let g = SamplingParams {
        temperature: 0.0,
        ..ban
    };
    assert_eq!(sample_once(g, &logits, &[]).unwrap().token, 1);
    let lift = SamplingParams {
        temperature: 0.0,
        logit_bias: vec![(3, 4.0), (3, 1.5)],
        ..params(|_| {})
    };
    assert_eq!(sample_once(lift, &logits, &[]).unwrap().token, 3);
    let all = params(|p| p.logit_bias = (0..4).map(|i| (i, f32::NEG_INFINITY)).collect());
    assert!(matches!(
        sample_once(all.clone(), &logits, &[]),
        Err(SamplingError::NoCandidates)
    ));
    let all_greedy = SamplingParams {
        temperature: 0.0,
        ..all
    };
    assert!(matches!(
        sample_once(all_greedy, &logits, &[]),
        Err(SamplingError::NoCandidates)
    ));
}

#[test]
fn nan_logits_never_win_and_all_nan_is_an_error() {
    let nan = f32::NAN;
    let g = SamplingParams {
        top_logprobs: 3,
        ..SamplingParams::greedy()
    };
    let s = sample_once(g, &[1.0, nan, 0.5], &[]).unwrap();
    assert_eq!(s.token, 0);
    // A NaN logit has probability 0: ln(e^1 + e^0.5) = 1.474077, so ln p(token 0) = -0.474077.
    assert!((s.logprob as f64 - -0.474_077).abs() < 1e-5, "{s:?}");
    // A NaN logit cannot be drawn, so it is no alternative either (not a -inf logprob).
    let ids: Vec<u32> = s.top.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [0, 2], "{:?}", s.top);
    let c = counts(params(|_| {}), &[nan, 0.0, nan, 0.0], 500);
    assert_eq!((c[0], c[2]), (0, 0), "{c:?}");
    for p in [
        SamplingParams::greedy(),
        params(|_| {}),
        SamplingParams {
            seed: Some(1),
            ..Default::default()
        },
    ] {
        let r = sample_once(p, &[nan, f32::NEG_INFINITY, nan], &[]);
        assert!(matches!(r, Err(SamplingError::NoCandidates)), "{r:?}");
    }
    // +inf is the largest finite logit, not a NaN factory.
    let s = sample_once(
        params(|p| p.top_logprobs = 1),
        &[0.0, f32::INFINITY, 1.0],
        &[],
    )
    .unwrap();
    assert_eq!(s.token, 1);
    assert!(s.logprob.is_finite() && s.top[0].1.is_finite(), "{s:?}");
}

#[test]
fn the_same_seed_gives_the_same_tokens_and_another_seed_other_tokens() {
    let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(params(|p| p.seed = Some(seed)), logits.len()).unwrap();
        let mut hist = Vec::new();
        for _ in 0..200 {
            let t = s.sample(&mut logits.clone(), &hist).unwrap().token;
            hist.push(t);
        }
        hist
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    // An OS seed is reported, and reusing it reproduces the run.
    let s = Sampler::new(params(|p| p.seed = None), 64).unwrap();
    assert_eq!(run(s.seed()), run(s.seed()));
}

#[test]
fn the_random_stream_is_reference_splitmix64_and_xoshiro256_starstar() {
    // Values from an independent implementation of Vigna's reference code.
    let mut sm = 0u64;
    let first: Vec<u64> = (0..4).map(|_| splitmix64(&mut sm)).collect();
    assert_eq!(
        first,
        [
            0xe220a8397b1dcdaf,
            0x6e789e6aa1b965f4,
            0x06c45d188009454f,
            0xf88bb8a8724c81ec
        ]
    );
    let mut r = Xoshiro256::from_seed(0);
    let out: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
    assert_eq!(
        out,
        [
            0x99ec5f36cb75f2b4,
            0xbf6e1f784956452a,
            0x1a5f849d4933e6e0,
            0x6aa594f1262d2d2c
        ]
    );
    let mut r = Xoshiro256::from_seed(42);
    let out: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
    assert_eq!(
        out,
        [0x15780b2e0c2ec716, 0x6104d9866d113a7e, 0xae17533239e499a1]
    );
    let u = Xoshiro256::from_seed(0).next_f64();
    assert_eq!(u, (0x99ec5f36cb75f2b4u64 >> 11) as f64 / 9007199254740992.0);
}

/// Pearson's chi-square of `observed` against probabilities `expected`.
fn chi_square(observed: &[usize], expected: &[f64]) -> f64 {
    let n: usize = observed.iter().sum();
    observed
        .iter()
        .zip(expected)
        .filter(|(_, &e)| e > 0.0)
        .map(|(&o, &e)| {
            let e = e * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

fn softmax_f64(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    let w: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}

#[test]
fn draw_frequencies_match_the_softmax_of_logits_over_temperature() {
    let logits = [1.0, 2.0, 0.5, -1.0, 1.5];
    // 4 degrees of freedom: P(chi2 > 30) ≈ 5e-6 for a correct sampler.
    for t in [0.7, 1.0, 2.0] {
        let c = counts(params(|p| p.temperature = t), &logits, 200_000);
        let chi = chi_square(&c, &softmax_f64(&logits, t as f64));
        assert!(chi < 30.0, "T {t}: chi2 {chi}, counts {c:?}");
    }
    // Top-k 3 renormalizes over ids 1, 4, 0 (2 degrees of freedom; P(chi2 > 25) ≈ 4e-6).
    let c = counts(
        params(|p| {
            p.top_k = 3;
            p.temperature = 0.9;
        }),
        &logits,
        100_000,
    );
    assert_eq!((c[2], c[3]), (0, 0));
    let sub = softmax_f64(&[1.0, 2.0, 1.5], 0.9);
    let chi = chi_square(&[c[0], c[1], c[4]], &sub);
    assert!(chi < 25.0, "top-k: chi2 {chi}, counts {c:?}");
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    // ln(e^1 + e^2 + e^3) = 3 + ln(1 + e^-1 + e^-2) = 3.4076059644.
    let logits = [1.0, 2.0, 3.0];
    let s = sample_once(
        SamplingParams {
            top_logprobs: 2,
            ..SamplingParams::greedy()
        },
        &logits,
        &[],
    )
    .unwrap();
    assert_eq!(s.token, 2);
    assert!((s.logprob as f64 - -0.407_605_964_4).abs() < 1e-5, "{s:?}");
    assert_eq!(s.top.len(), 2);
    assert_eq!((s.top[0].0, s.top[1].0), (2, 1));
    assert!(
        (s.top[0].1 as f64 - -0.407_605_964_4).abs() < 1e-5
            && (s.top[1].1 as f64 - -1.407_605_964_4).abs() < 1e-5,
        "{s:?}"
    );
    // Bias and penalties steer the choice but not the reported numbers.
    let steered = SamplingParams {
        logit_bias: vec![(0, 10.0)],
        repeat_penalty: 1.5,
        presence_penalty: 1.0,
        top_logprobs: 3,
        ..SamplingParams::greedy()
    };
    let s = sample_once(steered, &logits, &[2, 1]).unwrap();
    assert_eq!(s.token, 0);
    assert!((s.logprob as f64 - -2.407_605_964_4).abs() < 1e-5, "{s:?}");
    assert_eq!(s.top.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 1, 0]);
    // Ties in the top list go to the lower id.
    let s = sample_once(
        SamplingParams {
            top_logprobs: 2,
            ..SamplingParams::greedy()
        },
        &[0.0, 1.0, 0.0, 1.0],
        &[],
    )
    .unwrap();
    assert_eq!(s.top.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3]);
}

#[test]
fn logprobs_over_a_gemma_sized_vocabulary_match_f64() {
    let n = 262_144;
    let mut x = 99u64;
    let logits: Vec<f32> = (0..n)
        .map(|_| (splitmix64(&mut x) >> 40) as f32 / (1u64 << 24) as f32 * 30.0 - 15.0)
        .collect();
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    let lse = m + logits
        .iter()
        .map(|&l| (l as f64 - m).exp())
        .sum::<f64>()
        .ln();
    let s = sample_once(params(|p| p.top_logprobs = 20), &logits, &[]).unwrap();
    let want = logits[s.token as usize] as f64 - lse;
    assert!(
        (s.logprob as f64 - want).abs() < 1e-4,
        "{} vs {want}",
        s.logprob
    );
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    for (i, &(id, lp)) in s.top.iter().enumerate() {
        assert_eq!(id as usize, order[i]);
        assert!((lp as f64 - (logits[order[i]] as f64 - lse)).abs() < 1e-4);
    }
}

#[test]
fn exp_fast_is_within_3e_7_of_exp_and_zero_below_its_range() {
    let mut worst = 0.0f64;
    for i in 0..=200_000 {
        let x = -87.0 + 175.0 * i as f32 / 200_000.0;
        let want = (x as f64).exp();
        let rel = ((exp_fast(x) as f64 - want) / want).abs();
        worst = worst.max(rel);
    }
    assert!(worst < 3e-7, "worst relative error {worst}");
    assert_eq!(exp_fast(0.0), 1.0);
    assert_eq!(exp_fast(-87.5), 0.0);
    assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
}

#[test]
fn out_of_range_parameters_are_errors_naming_the_field() {
    let field_of = |p: SamplingParams| match Sampler::new(p, 10) {
        Err(SamplingError::BadParam { field, .. }) => field,
        other => panic!("expected BadParam, got {:?}", other.map(|_| ())),
    };
    let d = SamplingParams::default;
    assert_eq!(
        field_of(SamplingParams {
            temperature: f32::NAN,
            ..d()
        }),
        "temperature"
    );
    assert_eq!(
        field_of(SamplingParams {
            temperature: f32::INFINITY,
            ..d()
        }),
        "temperature"
    );
    for v in [0.0, -0.1, 1.01, f32::NAN] {
        assert_eq!(field_of(SamplingParams { top_p: v, ..d() }), "top_p");
        assert_eq!(
            field_of(SamplingParams {
                typical_p: v,
                ..d()
            }),
            "typical_p"
        );
    }
    for v in [-0.01, 1.5, f32::NAN] {
        assert_eq!(field_of(SamplingParams { min_p: v, ..d() }), "min_p");
    }
    for v in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(
            field_of(SamplingParams {
                repeat_penalty: v,
                ..d()
            }),
            "repeat_penalty"
        );
    }
    for v in [2.5, -2.01, f32::NAN] {
        assert_eq!(
            field_of(SamplingParams {
                presence_penalty: v,
                ..d()
            }),
            "presence_penalty"
        );
        assert_eq!(
            field_of(SamplingParams {
                frequency_penalty: v,
                ..d()
            }),
            "frequency_penalty"
        );
    }
    assert_eq!(
        field_of(SamplingParams {
            top_logprobs: 21,
            ..d()
        }),
        "top_logprobs"
    );
    assert_eq!(
        field_of(SamplingParams {
            top_logprobs: 11,
            ..d()
        }),
        "top_logprobs"
    );
    // The edges of each range are accepted.
    let edges = SamplingParams {
        temperature: -3.0,
        top_p: 1.0,
        min_p: 1.0,
        typical_p: 1e-6,
        presence_penalty: -2.0,
        frequency_penalty: 2.0,
        top_logprobs: 10,
        logit_bias: vec![(9, -100.0), (0, f32::NEG_INFINITY)],
        ..d()
    };
    assert!(Sampler::new(edges, 10).is_ok());
    assert!(SamplingParams {
        top_logprobs: 20,
        ..d()
    }
    .validate(262_144)
    .is_ok());
    // Above OpenAI's 20 even where the vocabulary is large enough.
    let r = SamplingParams {
        top_logprobs: 21,
        ..d()
    }
    .validate(262_144);
    assert!(
        matches!(
            r,
            Err(SamplingError::BadParam {
                field: "top_logprobs",
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn bad_bias_vocab_and_logits_length_are_typed_errors() {
    let d = SamplingParams::default;
    let r = Sampler::new(
        SamplingParams {
            logit_bias: vec![(1, 0.5), (10, 1.0)],
            ..d()
        },
        10,
    );
    assert!(matches!(
        r,
        Err(SamplingError::BiasTokenOutOfRange {
            index: 1,
            token: 10,
            n_vocab: 10
        })
    ));
    for b in [f32::NAN, f32::INFINITY] {
        let r = Sampler::new(
            SamplingParams {
                logit_bias: vec![(3, b)],
                ..d()
            },
            10,
        );
        assert!(matches!(
            r,
            Err(SamplingError::BadBias {
                index: 0,
                token: 3,
                ..
            })
        ));
    }
    assert!(matches!(
        Sampler::new(d(), 0),
        Err(SamplingError::BadVocab { n_vocab: 0 })
    ));
    let mut s = Sampler::new(d(), 4).unwrap();
    let r = s.sample(&mut [0.0; 5], &[]);
    assert!(matches!(
        r,
        Err(SamplingError::LogitsLength { got: 5, n_vocab: 4 })
    ));
}

/// Alternatives are tokens that can be drawn: with a grammar's mask leaving
/// two, four asked for give those two, in order, finite.
#[test]
fn top_logprobs_leave_out_masked_tokens() {
    let mut logits = vec![f32::NEG_INFINITY; 16];
    logits[3] = 1.0;
    logits[9] = 2.5;
    let s = sample_once(params(|p| p.top_logprobs = 4), &logits, &[]).unwrap();
    let ids: Vec<u32> = s.top.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [9, 3], "{:?}", s.top);
    assert!(s.top.iter().all(|&(_, lp)| lp.is_finite() && lp <= 0.0), "{:?}", s.top);
}

/// Logits with what a selection must get right: ties at the cut (ids
/// decide), NaN, both infinities, -0.0, and a few large ones.
fn awkward_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xoshiro256::from_seed(seed);
    let mut v: Vec<f32> = (0..n).map(|_| ((rng.next_f64() * 8.0).floor() - 4.0) as f32 * 0.5).collect();
    v[3] = f32::NAN;
    v[5] = f32::NEG_INFINITY;
    v[n / 2] = -0.0;
    v[n - 1] = 3.0;
    v[n - 2] = 3.0;
    v
}

#[test]
fn a_top_k_selection_samples_what_the_whole_row_samples() {
    let n = 3000;
    let cases: Vec<(&str, SamplingParams)> = vec![
        ("defaults", SamplingParams { seed: Some(11), ..SamplingParams::default() }),
        ("greedy", params(|p| p.temperature = 0.0)),
        ("top-k 1 hot", params(|p| (p.top_k, p.temperature) = (1, 1.5))),
        ("top-k 200, top-p 0.5", params(|p| (p.top_k, p.top_p) = (200, 0.5))),
        ("top-k 64, typical 0.8, logprobs 5", params(|p| (p.top_k, p.typical_p, p.top_logprobs) = (64, 0.8, 5))),
        ("top-k 256, min-p 0.2", params(|p| (p.top_k, p.min_p) = (256, 0.2))),
    ];
    for (name, p) in cases {
        let mut whole = Sampler::new(p.clone(), n).unwrap();
        let mut top = Sampler::new(p.clone(), n).unwrap();
        let k = top.needs_top().unwrap_or_else(|| panic!("{name}: should take a selection"));
        let mut sel = TopRows::default();
        for draw in 0..200 {
            let logits = awkward_logits(n, draw);
            // The kernel may keep more than the sampler needs.
            sel.select(&logits, n, (k + draw as usize % 3).min(TOP_ROWS_MAX_K));
            let want = whole.sample(&mut logits.clone(), &[]).unwrap();
            let got = top.sample_top(sel.row(0)).unwrap();
            assert_eq!(got, want, "{name}, draw {draw}");
        }
    }
}

#[test]
fn a_selection_keeps_the_best_finite_logits_ties_to_lower_ids() {
    let logits = [1.0, f32::NAN, 2.0, 2.0, f32::NEG_INFINITY, 2.0, f32::INFINITY, -0.0];
    let mut sel = TopRows::default();
    sel.select(&logits, 8, 3);
    let r = sel.row(0);
    let mut got: Vec<(u32, f32)> = r.ids.iter().copied().zip(r.logits.iter().copied()).collect();
    got.sort_by_key(|e| e.0);
    assert_eq!(got, vec![(2, 2.0), (3, 2.0), (6, f32::MAX)]);
    assert_eq!(r.max, f32::MAX);
    // Fewer finite logits than k: every finite one, no -inf or NaN.
    sel.select(&logits, 8, 8);
    assert_eq!(sel.counts[0], 6);
    assert!(sel.row(0).ids.iter().all(|&i| i != 1 && i != 4));
    // Nothing finite: no candidates, and sampling says so.
    sel.select(&[f32::NAN, f32::NEG_INFINITY], 2, 4);
    assert_eq!((sel.counts[0], sel.max[0]), (0, f32::NEG_INFINITY));
    let mut s = Sampler::new(params(|p| p.top_k = 4), 2).unwrap();
    assert!(matches!(s.sample_top(sel.row(0)), Err(SamplingError::NoCandidates)));
}

#[test]
fn samplers_that_edit_the_row_or_keep_every_token_need_the_whole_row() {
    let needs = |f: fn(&mut SamplingParams)| Sampler::new(params(f), 100).unwrap().needs_top();
    assert_eq!(needs(|p| p.top_k = 40), Some(40));
    assert_eq!(needs(|p| (p.top_k, p.top_logprobs) = (4, 9)), Some(9));
    assert_eq!(needs(|p| p.temperature = 0.0), Some(1));
    assert_eq!(needs(|p| p.top_k = 0), None);
    assert_eq!(needs(|p| p.top_k = TOP_ROWS_MAX_K + 1), None);
    assert_eq!(needs(|p| (p.top_k, p.repeat_penalty) = (40, 1.1)), None);
    assert_eq!(needs(|p| (p.top_k, p.logit_bias) = (40, vec![(3, 1.0)])), None);
    // Too few candidates for the sampler: an error, not a different token.
    let mut sel = TopRows::default();
    sel.select(&awkward_logits(100, 1), 100, 8);
    let mut s = Sampler::new(params(|p| p.top_k = 40), 100).unwrap();
    assert!(matches!(s.sample_top(sel.row(0)), Err(SamplingError::NeedsWholeRow)));
}
