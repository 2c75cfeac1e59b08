//! The provisioning brake: how many nodes may be asked for in a pool right now.
//!
//! Two bounds apply to every CreateNode the operator makes (spares, bundle replicas, migration
//! targets): the pool's `maxNodes` (spares count against it like any node), and a rate, at most
//! [`ProvisionBudget::per_minute`] requests per pool in any sliding minute, so a target of
//! thousands, a crash-looping job or a bad instance type cannot run up a cloud bill in seconds.
//!
//! Pure: the caller passes the clock. Memory is bounded: at most `per_minute` timestamps per pool.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};

/// The sliding window of the rate.
pub const WINDOW: TimeDelta = TimeDelta::minutes(1);

/// Requests per pool per minute when the configuration says nothing.
pub const DEFAULT_PER_MINUTE: u32 = 60;

/// Recent node requests per pool.
#[derive(Debug, Clone)]
pub struct ProvisionBudget {
    per_minute: u32,
    recent: HashMap<String, VecDeque<DateTime<Utc>>>,
}

impl Default for ProvisionBudget {
    fn default() -> Self {
        ProvisionBudget::new(DEFAULT_PER_MINUTE)
    }
}

impl ProvisionBudget {
    /// A budget of `per_minute` requests per pool (at least 1).
    pub fn new(per_minute: u32) -> Self {
        ProvisionBudget {
            per_minute: per_minute.max(1),
            recent: HashMap::new(),
        }
    }

    /// The rate limit per pool.
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// How many requests `pool` may make now.
    pub fn allowance(&mut self, pool: &str, now: DateTime<Utc>) -> u32 {
        let Some(q) = self.recent.get_mut(pool) else {
            return self.per_minute;
        };
        while q
            .front()
            .is_some_and(|t| now.signed_duration_since(*t) >= WINDOW)
        {
            q.pop_front();
        }
        let used = u32::try_from(q.len()).unwrap_or(u32::MAX);
        if q.is_empty() {
            self.recent.remove(pool);
        }
        self.per_minute.saturating_sub(used)
    }

    /// Takes one request from `pool`'s allowance; `false` (and nothing recorded) when none is left.
    pub fn take(&mut self, pool: &str, now: DateTime<Utc>) -> bool {
        if self.allowance(pool, now) == 0 {
            return false;
        }
        self.recent
            .entry(pool.to_owned())
            .or_default()
            .push_back(now);
        true
    }
}

/// How many more nodes a pool may have under its `maxNodes`: `None` when it has no bound.
/// `nodes` counts every node of the pool that is starting or started (spares included), plus
/// those asked for that Manager does not show yet.
pub fn room_under_max_nodes(max_nodes: Option<u32>, nodes: u32) -> Option<u32> {
    max_nodes.map(|m| m.saturating_sub(nodes))
}

/// Where a pool stands against its `maxNodes`, for its `AtMaxNodes` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxNodesStanding {
    /// No bound.
    Unbounded,
    /// Room for more nodes.
    Below { nodes: u32, max_nodes: u32 },
    /// At the bound: no new node, which bundles that need one say.
    Reached { max_nodes: u32 },
    /// More nodes than the bound (it was lowered below the count): no new node until enough
    /// go; the operator stops none of them to meet it.
    Above { nodes: u32, max_nodes: u32 },
}

impl MaxNodesStanding {
    /// The standing of a pool of `nodes` nodes (starting or started, spares included).
    pub fn of(max_nodes: Option<u32>, nodes: u32) -> Self {
        match max_nodes {
            None => MaxNodesStanding::Unbounded,
            Some(m) if nodes < m => MaxNodesStanding::Below {
                nodes,
                max_nodes: m,
            },
            Some(m) if nodes == m => MaxNodesStanding::Reached { max_nodes: m },
            Some(m) => MaxNodesStanding::Above {
                nodes,
                max_nodes: m,
            },
        }
    }

    /// `AtMaxNodes` is True at or above the bound.
    pub fn at_max(self) -> bool {
        matches!(
            self,
            MaxNodesStanding::Reached { .. } | MaxNodesStanding::Above { .. }
        )
    }

    /// The condition's reason.
    pub fn reason(self) -> &'static str {
        match self {
            MaxNodesStanding::Unbounded => "NoMaxNodes",
            MaxNodesStanding::Below { .. } => "BelowMaxNodes",
            MaxNodesStanding::Reached { .. } => "MaxNodesReached",
            MaxNodesStanding::Above { .. } => "AboveMaxNodes",
        }
    }

    /// The condition's message.
    pub fn message(self) -> String {
        match self {
            MaxNodesStanding::Unbounded => String::new(),
            MaxNodesStanding::Below { nodes, max_nodes } => {
                format!("{nodes} nodes of at most {max_nodes}")
            }
            MaxNodesStanding::Reached { max_nodes } => format!(
                "the pool has {max_nodes} nodes, its maxNodes: no new node is made in it until one goes or maxNodes is raised"
            ),
            MaxNodesStanding::Above { nodes, max_nodes } => format!(
                "the pool has {nodes} nodes, {} more than its maxNodes ({max_nodes}): no new node is made in it until {} go or maxNodes is raised; the operator stops none of them to meet the bound",
                nodes - max_nodes,
                nodes - max_nodes + 1,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0)
            .single()
            .unwrap_or_default()
    }

    #[test]
    fn a_pool_gets_its_rate_and_no_more_within_a_minute() {
        let mut b = ProvisionBudget::new(3);
        assert!(b.take("p", t(0)));
        assert!(b.take("p", t(1)));
        assert!(b.take("p", t(2)));
        assert!(!b.take("p", t(3)));
        assert_eq!(b.allowance("p", t(59)), 0);
        assert_eq!(
            b.allowance("p", t(60)),
            1,
            "the first request left the window"
        );
        assert_eq!(b.allowance("q", t(3)), 3, "pools have their own budget");
    }

    #[test]
    fn a_zero_rate_still_allows_one_request_a_minute() {
        let mut b = ProvisionBudget::new(0);
        assert!(b.take("p", t(0)));
        assert!(!b.take("p", t(1)));
    }

    #[test]
    fn room_under_max_nodes_never_goes_negative() {
        assert_eq!(room_under_max_nodes(None, 10_000), None);
        assert_eq!(room_under_max_nodes(Some(20), 5), Some(15));
        assert_eq!(room_under_max_nodes(Some(20), 25), Some(0));
    }

    #[test]
    fn a_pool_above_its_max_nodes_says_by_how_much_and_what_comes_next() {
        assert_eq!(MaxNodesStanding::of(None, 7), MaxNodesStanding::Unbounded);
        let below = MaxNodesStanding::of(Some(10), 3);
        assert_eq!((below.at_max(), below.reason()), (false, "BelowMaxNodes"));
        let reached = MaxNodesStanding::of(Some(3), 3);
        assert_eq!(
            (reached.at_max(), reached.reason()),
            (true, "MaxNodesReached")
        );
        let above = MaxNodesStanding::of(Some(2), 5);
        assert_eq!((above.at_max(), above.reason()), (true, "AboveMaxNodes"));
        assert_eq!(
            above.message(),
            "the pool has 5 nodes, 3 more than its maxNodes (2): no new node is made in it until 4 go or maxNodes is raised; the operator stops none of them to meet the bound"
        );
    }

    proptest! {
        #[test]
        fn no_sliding_minute_ever_holds_more_than_the_rate(
            rate in 1u32..20,
            gaps in proptest::collection::vec(0i64..30, 1..200),
        ) {
            let mut b = ProvisionBudget::new(rate);
            let mut taken: Vec<i64> = Vec::new();
            let mut now = 0i64;
            for g in gaps {
                now += g;
                if b.take("p", t(now)) {
                    taken.push(now);
                }
            }
            for (i, start) in taken.iter().enumerate() {
                let in_window = taken[i..].iter().take_while(|x| **x - start < 60).count();
                prop_assert!(in_window as u32 <= rate);
            }
        }
    }
}
