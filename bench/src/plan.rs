//! The request mix of a rehearsal, decided before the first request is sent
//! (so the expected outcome is known exactly): new buyers, repeat buyers,
//! buyers who keep asking after they bought their limit, idempotent retries
//! of earlier requests, and requests for made-up product ids.

/// One planned request: quantity 1 for `user`, with an Idempotency-Key when
/// it is retried later or is itself a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Which of the rehearsal's sales (a retry goes to its original's).
    pub sale: usize,
    pub user: u64,
    /// Index of the request whose key this one carries (itself, for an original).
    pub key: Option<usize>,
    /// Set on a retry: the request it repeats.
    pub retry_of: Option<usize>,
    /// For a made-up product id (`nosuch-<index>`), not the sale's.
    pub unknown: bool,
}

/// The mix's knobs.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub requests: u64,
    pub users: u64,
    pub repeat_share: f64,
    pub retry_share: f64,
    pub seed: u64,
    /// Sales the requests are spread over, round robin.
    pub sales: usize,
    /// Share of requests from a buyer who (most likely) bought already: one
    /// of the first `stock` new buyers of the sale.
    pub limit_share: f64,
    /// Share of requests for a made-up product id.
    pub unknown_share: f64,
    /// Units per sale (who counts as an early buyer).
    pub stock: u64,
}

/// xorshift64*: enough randomness for a request mix, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn plan(mix: Mix) -> Vec<Planned> {
    let mut rng = Rng(mix.seed.max(1));
    let mut plan: Vec<Planned> = Vec::with_capacity(mix.requests as usize);
    let mut new_users = 0u64;
    let sales = mix.sales.max(1);
    // Per sale: its first `stock` new buyers, the ones who got the units.
    let mut early: Vec<Vec<u64>> = vec![Vec::new(); sales];
    let bounds = [
        mix.retry_share,
        mix.unknown_share,
        mix.limit_share,
        mix.repeat_share,
    ];
    let [retry, unknown, limit, repeat] = {
        let mut acc = 0.0;
        bounds.map(|share| {
            acc += share;
            acc
        })
    };
    for i in 0..mix.requests as usize {
        let roll = rng.unit();
        let sale = i % sales;
        let simple = |user| Planned {
            sale,
            user,
            key: None,
            retry_of: None,
            unknown: false,
        };
        let p = if i > 0 && roll < retry {
            let j = rng.below(i);
            let j = plan[j].retry_of.unwrap_or(j); // retry the original, not a retry
            plan[j].key = Some(j);
            Planned {
                key: Some(j),
                retry_of: Some(j),
                ..plan[j].clone()
            }
        } else if roll < unknown {
            Planned {
                unknown: true,
                ..simple(rng.next() % mix.users.max(1) + 1)
            }
        } else if roll < limit && !early[sale].is_empty() {
            let buyers = &early[sale];
            simple(buyers[rng.below(buyers.len())])
        } else if i > 0 && roll < repeat {
            simple(plan[rng.below(i)].user)
        } else {
            new_users += 1;
            let user = (new_users - 1) % mix.users.max(1) + 1;
            if (early[sale].len() as u64) < mix.stock {
                early[sale].push(user);
            }
            simple(user)
        };
        plan.push(p);
    }
    plan
}

/// Units sale `sale` (of `stock`) must accept for this plan: every buyer
/// gets up to `limit` of the units they asked for (a retry asks for nothing
/// new), until the stock runs out.
pub fn expected_units(plan: &[Planned], sale: usize, stock: u64, limit: u64) -> u64 {
    let mut asked: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for p in plan
        .iter()
        .filter(|p| p.retry_of.is_none() && !p.unknown && p.sale == sale)
    {
        *asked.entry(p.user).or_default() += 1;
    }
    let allowed: u64 = asked.values().map(|&n| n.min(limit)).sum();
    allowed.min(stock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(requests: u64, users: u64) -> Mix {
        Mix {
            requests,
            users,
            repeat_share: 0.2,
            retry_share: 0.1,
            seed: 7,
            sales: 3,
            limit_share: 0.2,
            unknown_share: 0.05,
            stock: 50,
        }
    }

    #[test]
    fn retries_repeat_an_original_with_its_key() {
        let p = plan(mix(5_000, 1_000));
        let retries: Vec<_> = p.iter().filter(|r| r.retry_of.is_some()).collect();
        assert!(retries.len() > 300, "about a tenth are retries");
        for r in retries {
            let original = &p[r.retry_of.unwrap()];
            assert_eq!(original.retry_of, None);
            assert_eq!(original.user, r.user);
            assert_eq!(original.sale, r.sale);
            assert_eq!(original.key, r.key);
        }
    }

    #[test]
    fn expected_units_follow_limit_and_stock() {
        let at = |sale, user, key, retry_of| Planned {
            sale,
            user,
            key,
            retry_of,
            unknown: false,
        };
        let p = vec![
            at(0, 1, None, None),
            at(0, 1, Some(1), None),
            at(0, 1, Some(1), Some(1)),
            at(0, 2, None, None),
            at(1, 2, None, None),
        ];
        assert_eq!(expected_units(&p, 0, 100, 1), 2);
        assert_eq!(expected_units(&p, 0, 100, 5), 3);
        assert_eq!(expected_units(&p, 0, 1, 5), 1);
        assert_eq!(expected_units(&p, 1, 100, 5), 1);
        let mut q = p.clone();
        q.push(Planned {
            unknown: true,
            ..at(0, 3, None, None)
        });
        assert_eq!(
            expected_units(&q, 0, 100, 1),
            2,
            "a made-up id buys nothing"
        );
    }

    #[test]
    fn the_mix_has_its_shares_and_limit_buyers_are_early_buyers() {
        let p = plan(mix(20_000, 5_000));
        let share = |f: &dyn Fn(&Planned) -> bool| {
            p.iter().filter(|r| f(r)).count() as f64 / p.len() as f64
        };
        let unknown = share(&|r| r.unknown && r.retry_of.is_none());
        assert!((0.04..0.06).contains(&unknown), "unknown {unknown}");
        // The first 50 new buyers of each sale, asked for again and again.
        let mut early: Vec<Vec<u64>> = vec![Vec::new(); 3];
        let mut seen = std::collections::HashSet::new();
        let mut from_early = 0;
        for r in p.iter().filter(|r| r.retry_of.is_none() && !r.unknown) {
            if seen.insert(r.user) && early[r.sale].len() < 50 {
                early[r.sale].push(r.user);
            } else if early[r.sale].contains(&r.user) {
                from_early += 1;
            }
        }
        let limit = from_early as f64 / p.len() as f64;
        assert!(limit > 0.19, "limit buyers {limit}");
    }
}
