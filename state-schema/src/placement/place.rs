//! Placing one environment: its pinned roles where their volumes are, its sticky replicas where
//! they run, the rest on the best eligible node with room, then where its release and cron
//! runs go; what was placed reserved on the fleet.

use super::*;

impl Fleet {
    /// Places `spec`'s replicas (its `replicas` per role, in `pool`, by `placement`), filling
    /// `instances`, `nodes`, `ingress_nodes` and the release roles' node, and reserves them.
    /// Returns the replicas that wait.
    pub fn place(&mut self, spec: &mut DeploymentSpec) -> Vec<Waiting> {
        let env = spec.environment.clone();
        let before: Vec<Instance> = self
            .current
            .get(&env)
            .map(|h| h.iter().map(|(i, _, _)| i.clone()).collect())
            .unwrap_or_default();
        self.release(&env);
        self.volume_generations(spec);
        let Some(pool) = spec.pool.clone() else {
            // A spec from before placement knew pools: it stays as it is.
            self.hold(spec);
            return Vec::new();
        };
        let mut p = Placing {
            env: &env,
            pool: &pool,
            before,
            placed: Vec::new(),
            waiting: Vec::new(),
        };
        // Pinned first, then sticky, then the rest, each on the best eligible node with room.
        self.place_pinned(spec, &mut p);
        let open = self.place_sticky(spec, &mut p);
        self.place_open(spec, &mut p, open);
        let Placing {
            mut placed,
            mut waiting,
            ..
        } = p;
        placed.sort();
        let held: Vec<(Instance, u64, u64)> = placed
            .iter()
            .map(|i| {
                let (cpu, mem, _) = need(spec, &i.role);
                (i.clone(), cpu, mem)
            })
            .collect();
        // Release roles run once per generation, on a node with a replica (or else the first
        // eligible one); their resources are not held, since they end.
        let release_node = placed.first().map(|i| i.node.clone()).or_else(|| {
            self.nodes
                .iter()
                .find(|(_, n)| n.pool == pool && n.takes_new(&["docker"]))
                .map(|(name, _)| name.clone())
        });
        spec.release = self.runs(spec, "release", release_node.as_ref(), &mut waiting);
        spec.cron = self.runs(spec, "cron", release_node.as_ref(), &mut waiting);
        let mut ingress: Vec<Name> = placed
            .iter()
            .filter(|i| spec.roles.get(&i.role).is_some_and(|r| r.is_web()))
            .map(|i| i.node.clone())
            .collect();
        ingress.sort();
        ingress.dedup();
        let mut nodes: Vec<Name> = placed.iter().map(|i| i.node.clone()).collect();
        nodes.extend(spec.release.iter().chain(&spec.cron).map(|(_, n)| n.clone()));
        nodes.sort();
        nodes.dedup();
        spec.instances = placed;
        spec.nodes = nodes;
        spec.ingress_nodes = ingress;
        // What was placed is what the environment holds (reserved above).
        self.current.insert(env, held);
        waiting
    }

    /// Each volume at the generation its rows name (a restore's new one).
    fn volume_generations(&self, spec: &mut DeploymentSpec) {
        if self.generations.is_empty() {
            return;
        }
        let env = spec.environment.clone();
        for (_, r) in spec.roles.iter_mut() {
            for v in &mut r.volumes {
                v.generation = Name::new(&v.name)
                    .ok()
                    .and_then(|n| self.generations.get(&(env.clone(), n)).copied())
                    .unwrap_or(1);
            }
        }
    }

    /// The node a role with volumes is pinned to (most fleets pin nothing: no key is built then).
    fn pinned_role(&self, spec: &DeploymentSpec, role: &Name) -> Option<Name> {
        if self.pins.is_empty() || spec.roles.get(role).is_none_or(|r| r.volumes.is_empty()) {
            return None;
        }
        self.pins.get(&(spec.environment.clone(), role.clone())).cloned()
    }

    /// Reserves a replica's resources on `node`.
    fn reserve(&mut self, node: &Name, cpu: u64, mem: u64) {
        let u = self.used.entry(node.clone()).or_default();
        u.0 += cpu;
        u.1 += mem;
    }

    /// Pinned roles: a role with volumes runs where its data is, or not at all. Placement never
    /// moves it; a draining node keeps it (and the drain waits for `pl volume move`).
    fn place_pinned(&mut self, spec: &DeploymentSpec, p: &mut Placing<'_>) {
        for (role, count) in &spec.replicas {
            let Some(node) = self.pinned_role(spec, role) else {
                continue;
            };
            let (cpu, mem, _) = need(spec, role);
            let moving = !self.moving.is_empty() && self.moving.contains(&(p.env.clone(), role.clone()));
            for index in 0..*count {
                let stays = !moving
                    && self.nodes.get(&node).is_some_and(|n| {
                        &n.pool == p.pool
                            && matches!(n.git, NodeState::Active | NodeState::Draining)
                            && matches!(n.liveness, Liveness::Ready | Liveness::Quiet | Liveness::Unhealthy)
                    });
                if stays && index == 0 {
                    self.reserve(&node, cpu, mem);
                    p.placed
                        .push(moved_from(&p.before, Instance::new(role.clone(), index, node.clone())));
                } else {
                    p.waiting.push(Waiting {
                        role: role.clone(),
                        index,
                        reason: if moving { VOLUME_MOVING } else { VOLUME_PINNED }.into(),
                    });
                }
            }
        }
    }

    /// Sticky: every replica that may stay where it runs, stays. The replicas left to place.
    fn place_sticky(&mut self, spec: &DeploymentSpec, p: &mut Placing<'_>) -> Vec<(Name, u32)> {
        let mut open = Vec::new();
        for (role, count) in &spec.replicas {
            if self.pinned_role(spec, role).is_some() {
                continue;
            }
            let (cpu, mem, _) = need(spec, role);
            for index in 0..*count {
                let stay = p
                    .before
                    .iter()
                    .find(|i| &i.role == role && i.index == index)
                    .and_then(|i| {
                        let n = self.nodes.get(&i.node)?;
                        (&n.pool == p.pool && n.keeps() && self.fits(&i.node, n, cpu, mem)).then(|| i.node.clone())
                    });
                match stay {
                    Some(node) => {
                        self.reserve(&node, cpu, mem);
                        p.placed
                            .push(moved_from(&p.before, Instance::new(role.clone(), index, node)));
                    }
                    None => open.push((role.clone(), index)),
                }
            }
        }
        open
    }

    /// The rest, one at a time, each on the best eligible node with room (by `placement`).
    fn place_open(&mut self, spec: &DeploymentSpec, p: &mut Placing<'_>, open: Vec<(Name, u32)>) {
        for (role, index) in open {
            let (cpu, mem, needs) = need(spec, &role);
            let candidates = self
                .nodes
                .iter()
                .filter(|(name, n)| &n.pool == p.pool && n.takes_new(&needs) && self.fits(name, n, cpu, mem));
            let chosen = match spec.placement {
                Placement::Pack => candidates.map(|(name, _)| name.clone()).next(),
                Placement::Spread => candidates
                    .min_by_key(|(name, _)| {
                        let same_role = p.placed.iter().filter(|i| i.role == role && &i.node == *name).count();
                        let same_env = p.placed.iter().filter(|i| &i.node == *name).count();
                        (same_role, same_env, (*name).clone())
                    })
                    .map(|(name, _)| name.clone()),
            };
            match chosen {
                Some(node) => {
                    self.reserve(&node, cpu, mem);
                    p.placed.push(moved_from(&p.before, Instance::new(role, index, node)));
                }
                None => {
                    let reason = if self.any_eligible(p.pool, &needs) {
                        "no-capacity"
                    } else {
                        "no-eligible-node"
                    };
                    p.waiting.push(Waiting {
                        role,
                        index,
                        reason: reason.into(),
                    });
                }
            }
        }
    }

    /// Where the runs of `kind`'s roles (release, cron) go: the release node, or where a run's
    /// volumes are.
    fn runs(
        &self,
        spec: &DeploymentSpec,
        kind: &str,
        release_node: Option<&Name>,
        waiting: &mut Vec<Waiting>,
    ) -> Vec<(Name, Name)> {
        let env = &spec.environment;
        let mut out = Vec::new();
        for (role, r) in spec.roles.iter().filter(|(_, r)| r.kind == kind) {
            if !self.moving.is_empty() && self.moving.contains(&(env.clone(), role.clone())) {
                waiting.push(Waiting {
                    role: role.clone(),
                    index: 0,
                    reason: VOLUME_MOVING.into(),
                });
                continue;
            }
            let pin = (!self.pins.is_empty() && !r.volumes.is_empty())
                .then(|| self.pins.get(&(env.clone(), role.clone())))
                .flatten();
            match pin.or(release_node) {
                Some(node) => out.push((role.clone(), node.clone())),
                None => waiting.push(Waiting {
                    role: role.clone(),
                    index: 0,
                    reason: "no-eligible-node".into(),
                }),
            }
        }
        out
    }
}

/// One environment's placement under way.
struct Placing<'a> {
    env: &'a Name,
    pool: &'a Name,
    /// What it ran before.
    before: Vec<Instance>,
    placed: Vec<Instance>,
    waiting: Vec<Waiting>,
}

/// A role's resources (CPU millis, memory bytes) and what its node must have.
fn need(spec: &DeploymentSpec, role: &Name) -> (u64, u64, Vec<&'static str>) {
    spec.roles.get(role).map_or((0, 0, vec!["docker"]), |r| {
        let needs = if r.is_web() {
            vec!["docker", "ingress"]
        } else {
            vec!["docker"]
        };
        (r.cpu_millis, r.memory_bytes, needs)
    })
}

/// `placed` with its move count: a replica that stays keeps its count, one placed on another
/// node than the one it ran on counts one more move, and a new one has none.
fn moved_from(before: &[Instance], mut placed: Instance) -> Instance {
    if let Some(was) = before.iter().find(|b| b.same_slot(&placed)) {
        placed.moves = match was.node == placed.node {
            true => was.moves,
            false => was.moves.saturating_add(1),
        };
    }
    placed
}
