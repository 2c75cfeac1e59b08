//! Where a PlacementPool stands after its pass: the pool's own faults first (a spec the
//! placement engine refuses, a pool Manager does not have or has as another provider kind),
//! then its deletion held by the objects that name it, then what holds back new nodes in it
//! (Manager's refusal, the pool above its `maxNodes`). A pool is otherwise Ready: placement
//! uses it. Every stall lasts until the pool's spec, its users or Manager change.
//!
//! Pure: the caller observes and passes plain data.

use crate::bounded;
use crate::pass::Verdict;
use crate::vocab::Standing;

/// What Manager says of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagerView {
    /// Not asked (the pool was not loaded, or Manager is unreachable), or no answer.
    NotAsked,
    /// Manager has the pool, of the pool's provider kind.
    Known,
    /// Manager has no pool of that name.
    Unknown,
    /// Manager's pool of that name is of another provider kind.
    KindMismatch,
}

/// What a pool's pass observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFacts<'a> {
    pub name: &'a str,
    /// Why the placement engine refused the pool's spec, when it did.
    pub invalid: Option<String>,
    pub manager: ManagerView,
    /// The objects that name the pool while it is being deleted (empty otherwise).
    pub users: &'a [String],
    /// What holds back new nodes in the pool, as a reason and a message.
    pub held_back: Option<(&'static str, String)>,
}

/// Where the pool stands (see the module docs).
pub fn verdict(f: &PoolFacts<'_>) -> Verdict {
    if !f.users.is_empty() {
        return Verdict::stalled("InUse", in_use_message(f.users));
    }
    if let Some(why) = &f.invalid {
        return Verdict::stalled("InvalidPool", why.clone());
    }
    match f.manager {
        ManagerView::Unknown => {
            let why = format!("Manager has no pool named {}", f.name);
            return Verdict::stalled("UnknownToManager", why);
        }
        ManagerView::KindMismatch => {
            let why = format!("Manager's pool {} is of another provider kind", f.name);
            return Verdict::stalled("KindMismatch", why);
        }
        ManagerView::NotAsked | ManagerView::Known => {}
    }
    match &f.held_back {
        Some((reason, message)) => Verdict::stalled(reason, message.clone()),
        None => Verdict::new(Standing::Ready, "Valid", String::new()),
    }
}

/// The `InUse` message: who holds the pool, bounded like every condition message.
pub fn in_use_message(users: &[String]) -> String {
    let head = "deletion waits until nothing names this pool; used by ";
    let list = bounded::join_bounded(
        users,
        ", ",
        bounded::MAX_CONDITION_MESSAGE.saturating_sub(head.len()),
    );
    format!("{head}{list}")
}

/// The `ZoneDegraded` condition from what the zone brake says of each of the pool's zones
/// that get no new node now: (status, reason, message).
pub fn zone_degraded(degraded: &[String]) -> (bool, &'static str, String) {
    if degraded.is_empty() {
        return (false, "NoZoneDegraded", String::new());
    }
    let message = bounded::clip(&degraded.join("; "), 1024).into_owned();
    (true, "ZoneOutage", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts<'a>(users: &'a [String]) -> PoolFacts<'a> {
        PoolFacts {
            name: "east",
            invalid: None,
            manager: ManagerView::Known,
            users,
            held_back: None,
        }
    }

    #[test]
    fn a_pool_manager_knows_with_nothing_held_back_is_ready() {
        let v = verdict(&facts(&[]));
        assert_eq!((v.standing, v.reason), (Standing::Ready, "Valid"));
        let v = verdict(&PoolFacts {
            manager: ManagerView::NotAsked,
            ..facts(&[])
        });
        assert_eq!(
            v.standing,
            Standing::Ready,
            "Manager unreachable says nothing"
        );
    }

    #[test]
    fn the_pools_own_faults_come_first_then_its_users_then_what_holds_nodes_back() {
        let users = vec!["Bundle live/news".to_owned()];
        let all = PoolFacts {
            invalid: Some("zones must not be empty".into()),
            manager: ManagerView::Unknown,
            users: &users,
            held_back: Some(("ProvisioningRefused", "quota".into())),
            ..facts(&[])
        };
        assert_eq!(verdict(&all).reason, "InUse");
        let no_users = PoolFacts { users: &[], ..all };
        assert_eq!(verdict(&no_users).reason, "InvalidPool");
        let valid = PoolFacts {
            invalid: None,
            ..no_users
        };
        let v = verdict(&valid);
        assert_eq!(
            (v.reason, v.message.as_str()),
            ("UnknownToManager", "Manager has no pool named east")
        );
        let kind = PoolFacts {
            manager: ManagerView::KindMismatch,
            ..valid.clone()
        };
        assert_eq!(verdict(&kind).reason, "KindMismatch");
        let known = PoolFacts {
            manager: ManagerView::Known,
            ..valid
        };
        let v = verdict(&known);
        assert_eq!(
            (v.standing, v.reason, v.message.as_str()),
            (Standing::Stalled, "ProvisioningRefused", "quota")
        );
    }

    #[test]
    fn the_in_use_message_names_every_user_that_fits_and_counts_the_rest() {
        let few = vec![
            "Bundle default/news".to_owned(),
            "HotSpareTarget t".to_owned(),
        ];
        assert_eq!(
            in_use_message(&few),
            "deletion waits until nothing names this pool; used by Bundle default/news, HotSpareTarget t"
        );
        let many: Vec<String> = (0..5000)
            .map(|i| format!("Bundle ns-{i}/{}", "x".repeat(200)))
            .collect();
        let m = in_use_message(&many);
        assert!(m.len() <= bounded::MAX_CONDITION_MESSAGE, "{}", m.len());
        assert!(m.contains("Bundle ns-0/") && m.ends_with("more"), "{m}");
    }

    #[test]
    fn a_degraded_zone_is_named_and_none_is_said_so() {
        assert_eq!(zone_degraded(&[]), (false, "NoZoneDegraded", String::new()));
        let (on, reason, message) = zone_degraded(&["a lost 3 nodes".into(), "b too".into()]);
        assert_eq!((on, reason), (true, "ZoneOutage"));
        assert_eq!(message, "a lost 3 nodes; b too");
    }

    proptest! {
        /// Only a pool with no fault, no user and nothing held back is Ready, and a stall
        /// always says why.
        #[test]
        fn ready_only_when_nothing_stands_in_the_way(
            invalid in any::<bool>(), users in any::<bool>(), held in any::<bool>(),
            manager in prop::sample::select(vec![ManagerView::NotAsked, ManagerView::Known, ManagerView::Unknown, ManagerView::KindMismatch]),
        ) {
            let list = vec!["Bundle a/b".to_owned()];
            let f = PoolFacts {
                name: "p",
                invalid: invalid.then(|| "bad".to_owned()),
                manager,
                users: if users { &list } else { &[] },
                held_back: held.then(|| ("AtMaxNodes", "above".to_owned())),
            };
            let v = verdict(&f);
            let clear = !invalid && !users && !held
                && matches!(manager, ManagerView::NotAsked | ManagerView::Known);
            prop_assert_eq!(v.standing == Standing::Ready, clear);
            prop_assert!(clear || !v.message.is_empty());
        }
    }
}
