use super::*;
use rand::SeedableRng as _;
use rand_chacha::ChaCha8Rng;

#[test]
fn permutation_is_a_bijection() {
    for n in [1, 2, 3, 7, 64, 1000, 4097] {
        let p = Permutation::new(n, 42);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = p.apply(x);
            assert!(y < n);
            assert!(!seen[y as usize], "{y} hit twice for n={n}");
            seen[y as usize] = true;
        }
    }
}

/// The top 20% of keys (by observed frequency) draw the share the exact Zipf CDF predicts.
#[test]
fn top_fifth_of_keys_draws_the_zipf_share() {
    let n = 10_000u64;
    let draws = 1_000_000;
    for theta in [0.5, 0.8, 0.9, 0.99] {
        let chooser = KeyChooser::zipf(n, theta, 7).expect("valid parameters");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            counts[chooser.key(&mut rng) as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = counts[..(n / 5) as usize].iter().sum();
        let observed = top as f64 / draws as f64;
        let expected = zipf_top_share(n, theta, n / 5);
        assert!(
            (observed - expected).abs() < 0.01,
            "theta {theta}: top 20% drew {observed:.4}, Zipf says {expected:.4}"
        );
    }
}

/// Scrambling spreads the hottest keys over the key space instead of putting them at 0, 1, ...
#[test]
fn hot_keys_are_scrambled() {
    let chooser = KeyChooser::zipf(1_000_000, 0.99, 3).expect("valid parameters");
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let hot: Vec<u64> = (0..1000).map(|_| chooser.key(&mut rng)).collect();
    let low = hot.iter().filter(|&&k| k < 1000).count();
    assert!(low < 100, "{low} of 1000 draws landed on keys below 1000");
}

#[test]
fn uniform_when_theta_is_zero() {
    let chooser = KeyChooser::zipf(100, 0.0, 1).expect("valid parameters");
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut counts = [0u32; 100];
    for _ in 0..100_000 {
        counts[chooser.key(&mut rng) as usize] += 1;
    }
    assert!(
        counts.iter().all(|&c| (800..1200).contains(&c)),
        "{counts:?}"
    );
}
