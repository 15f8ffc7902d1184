//! A canary in the ingress: a share of a hostname's requests goes to the new release, the rest
//! to the release published before, by how many of the hostname's upstream slot files point
//! at each. Caddy picks an upstream at random for each request, so the share of slots is the
//! share of requests; changing it is a rename of a few slot files, which Caddy sees on the
//! next request: no reload, no stream cut, nothing in flight lost.
//!
//! Each node's list keeps both: its old release's upstreams, then a `canary <weight>` line and
//! the new release's. The next whole publish (the switch) drops the old ones; a publish of
//! another canary (a newer commit mid-canary) keeps the old release, which is still what
//! serves.

/// How a publish shares the hostname's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// Every request to the generation published: a plain publish, or a canary's switch.
    Whole,
    /// A canary step: this percent (1-99) to the generation published, the rest to the
    /// release this node published before (whole, when it published none).
    Canary(u8),
    /// A repaired replica's new address: the share the node's list holds for this
    /// generation stays (a canary stays a canary).
    Repair,
}

/// A node's canary: its weight, the new release's upstreams, and when this step began (Unix
/// milliseconds: the gates of the next step judge the requests since).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canary {
    pub weight: u8,
    pub dials: Vec<String>,
    pub since_ms: i64,
}

/// What a hostname's slots are shared among on this machine: the old release's upstreams (or
/// the only release's), the canary's, and the canary's weight (the highest any node of this
/// control plane published: the steps only go up).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shares {
    pub stable: Vec<String>,
    pub canary: Vec<String>,
    pub weight: u8,
}

impl Shares {
    /// Adds one node's list: its upstreams, and its canary if it has one.
    pub fn add(&mut self, dials: &[String], canary: Option<&Canary>) {
        self.stable.extend(dials.iter().cloned());
        if let Some(c) = canary {
            self.canary.extend(c.dials.iter().cloned());
            self.weight = self.weight.max(c.weight);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stable.is_empty() && self.canary.is_empty()
    }

    /// Every upstream, each once per list it is in.
    pub fn len(&self) -> usize {
        self.stable.len() + self.canary.len()
    }

    /// How many of `slots` the canary gets: its weight's share, rounded, and at least one
    /// slot and at most all but one while both releases have upstreams.
    pub fn canary_slots(&self, slots: usize) -> usize {
        match (self.stable.is_empty(), self.canary.is_empty()) {
            (_, true) => 0,
            (true, false) => slots,
            (false, false) => {
                let k = (usize::from(self.weight) * slots + 50) / 100;
                k.clamp(1, slots.saturating_sub(1).max(1))
            }
        }
    }

    /// The upstream each of `slots` slot files points at: the canary's first (round robin over
    /// its upstreams), then the old release's. Empty when there is no upstream at all.
    pub fn slot_dials(&self, slots: usize) -> Vec<String> {
        if self.is_empty() {
            return Vec::new();
        }
        let k = self.canary_slots(slots);
        (0..slots)
            .map(|i| match i < k {
                true => self.canary[i % self.canary.len()].clone(),
                false => self.stable[(i - k) % self.stable.len()].clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dials(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}:8080")).collect()
    }

    #[test]
    fn a_weight_is_its_share_of_the_slots_rounded_and_never_all_or_nothing() {
        let mut s = Shares::default();
        s.add(
            &dials("10.0.0.", 3),
            Some(&Canary {
                weight: 10,
                dials: dials("10.0.1.", 3),
                since_ms: 0,
            }),
        );
        assert_eq!(s.canary_slots(12), 1, "10% of 12 is 1.2");
        let slots = s.slot_dials(12);
        assert_eq!(slots.iter().filter(|d| d.starts_with("10.0.1.")).count(), 1);
        assert_eq!(slots.iter().filter(|d| d.starts_with("10.0.0.")).count(), 11);
        s.weight = 50;
        assert_eq!(s.canary_slots(12), 6);
        s.weight = 1;
        assert_eq!(
            s.canary_slots(12),
            1,
            "at least one slot: a canary always gets requests"
        );
        s.weight = 99;
        assert_eq!(s.canary_slots(12), 11, "never every slot before the switch");
        assert_eq!(s.canary_slots(20), 19);
    }

    #[test]
    fn without_an_old_release_the_canary_is_whole_and_without_a_canary_the_old_one_is() {
        let mut s = Shares::default();
        s.add(
            &[],
            Some(&Canary {
                weight: 10,
                dials: dials("10.0.1.", 2),
                since_ms: 0,
            }),
        );
        assert_eq!(s.slot_dials(12).len(), 12);
        assert!(s.slot_dials(12).iter().all(|d| d.starts_with("10.0.1.")));
        let mut s = Shares::default();
        s.add(&dials("10.0.0.", 2), None);
        assert!(s.slot_dials(12).iter().all(|d| d.starts_with("10.0.0.")));
        assert!(Shares::default().slot_dials(12).is_empty());
    }

    #[test]
    fn nodes_sharing_a_machine_add_up_and_the_newest_step_counts() {
        let mut s = Shares::default();
        s.add(
            &dials("10.0.0.", 1),
            Some(&Canary {
                weight: 10,
                dials: dials("10.0.1.", 1),
                since_ms: 0,
            }),
        );
        s.add(
            &dials("10.0.2.", 1),
            Some(&Canary {
                weight: 50,
                dials: dials("10.0.3.", 1),
                since_ms: 0,
            }),
        );
        assert_eq!((s.len(), s.weight), (4, 50));
        let slots = s.slot_dials(12);
        assert_eq!(&slots[..6].iter().filter(|d| d.starts_with("10.0.3.")).count(), &3);
        assert!(
            slots[6..]
                .iter()
                .all(|d| d.starts_with("10.0.0.") || d.starts_with("10.0.2."))
        );
    }
}
