//! A web role's `rollout:`: its strategy, a canary's steps (weights and pauses) and gates, and
//! a rolling replacement's batch sizes, decoded with their problems.

use super::*;

/// `rollout: {watchSeconds: N, strategy: switch | canary, steps: [...]}`: how long after a new
/// release's switch its replicas are watched (one found unhealthy meanwhile rolls the
/// environment back), and for a web role, whether a canary comes before the switch.
pub(super) fn decode_rollout(ctx: &mut Ctx<'_>, node: &Node<'_>, web: bool) -> Option<RolloutPolicy> {
    let f = Fields::new(ctx, node, "`rollout`", ROLLOUT_FIELDS)?;
    let watch = f.get("watchSeconds").map_or(Some(0), |n| {
        u32_in(ctx, n, "`rollout.watchSeconds`", 1, defaults::MAX_WATCH_SECONDS)
    });
    // Some(true): a canary; Some(false): switch or rolling; None: refused.
    let mut rolling_asked = false;
    let canary = match f.get("strategy") {
        None => Some(false),
        Some(n) => match crate::decode::string(ctx, n, "`rollout.strategy`")? {
            "switch" => Some(false),
            "canary" if web => Some(true),
            "canary" => {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    "`rollout.strategy: canary` is for a web role: the ingress splits its requests".to_owned(),
                    "leave `strategy` out: the new release starts beside the old one and takes over once healthy",
                );
                None
            }
            "rolling" => {
                rolling_asked = true;
                Some(false)
            }
            other => {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    format!("`rollout.strategy` is `{other}`; it must be one of switch, canary, rolling"),
                    "`strategy: canary` with `steps: [{weight: 10, pause: 60s}, {weight: 50}]`, or `strategy: rolling` with `maxSurge: 1`",
                );
                None
            }
        },
    };
    let rolling = decode_rolling(ctx, &f, rolling_asked);
    let steps = match (canary, f.get("steps")) {
        (Some(true), Some(n)) => decode_canary_steps(ctx, n),
        (Some(true), None) => {
            ctx.error_hint(
                Code::MissingField,
                f.pos,
                "`rollout.strategy: canary` needs `steps`".to_owned(),
                "e.g. `steps: [{weight: 10, pause: 60s}, {weight: 50}]`: a step without `pause` waits for `pl rollout promote`",
            );
            None
        }
        (Some(false), Some(n)) => {
            ctx.error_hint(
                Code::InvalidValue,
                n.pos,
                "`rollout.steps` is for `strategy: canary`".to_owned(),
                "add `strategy: canary`, or leave `steps` out",
            );
            None
        }
        (Some(false), None) => Some(Vec::new()),
        (None, _) => None,
    };
    let gates = match (canary, f.get("gates")) {
        (_, None) => Some(None),
        (Some(true), Some(n)) => decode_gates(ctx, n).map(Some),
        (Some(false), Some(n)) => {
            ctx.error_hint(
                Code::InvalidValue,
                n.pos,
                "`rollout.gates` is for `strategy: canary`".to_owned(),
                "add `strategy: canary` with its `steps`, or leave `gates` out",
            );
            None
        }
        (None, Some(_)) => None,
    };
    Some(RolloutPolicy {
        watch_seconds: watch?,
        steps: steps?,
        gates: gates?,
        rolling: rolling?,
    })
}

/// `maxSurge` and `maxUnavailable` of `strategy: rolling` (`asked`): each a count (0-1000) or
/// a percent (`25%`, 0-100%); by default one new replica at a time beside every old one
/// (`maxSurge: 1, maxUnavailable: 0`), and never both zero. Refused without `rolling`.
pub(super) fn decode_rolling(ctx: &mut Ctx<'_>, f: &Fields<'_>, asked: bool) -> Option<Option<Rolling>> {
    let (surge, down) = (f.get("maxSurge"), f.get("maxUnavailable"));
    if !asked {
        let mut fine = true;
        for (n, name) in [(surge, "maxSurge"), (down, "maxUnavailable")] {
            if let Some(n) = n {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    format!("`rollout.{name}` is for `strategy: rolling`"),
                    "add `strategy: rolling`, or leave it out",
                );
                fine = false;
            }
        }
        return fine.then_some(None);
    }
    let max_surge = surge.map_or(Some(Amount::Count(1)), |n| amount(ctx, n, "`rollout.maxSurge`"));
    let max_unavailable = down.map_or(Some(Amount::Count(0)), |n| amount(ctx, n, "`rollout.maxUnavailable`"));
    let (max_surge, max_unavailable) = (max_surge?, max_unavailable?);
    let zero = |a: Amount| matches!(a, Amount::Count(0) | Amount::Percent(0));
    if zero(max_surge) && zero(max_unavailable) {
        ctx.error_hint(
            Code::InvalidValue,
            surge.or(down).map_or(f.pos, |n| n.pos),
            "`rollout.maxSurge` and `rollout.maxUnavailable` are both 0: no replica could be replaced".to_owned(),
            "`maxSurge: 1` starts one new replica beside the old ones at a time",
        );
        return None;
    }
    Some(Some(Rolling {
        max_surge,
        max_unavailable,
    }))
}

/// A count of replicas (0-1000) or a percent of them (`25%`, 0-100%).
pub(super) fn amount(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Amount> {
    if let yaml::Value::Str(s) = &node.value {
        let s: &str = s.as_ref();
        if let Some(p) = s
            .strip_suffix('%')
            .and_then(|d| d.parse::<u8>().ok())
            .filter(|p| *p <= 100)
        {
            return Some(Amount::Percent(p));
        }
        ctx.error_hint(
            Code::InvalidValue,
            node.pos,
            format!("{what} is `{s}`, not a count or a percent"),
            "a number of replicas (`1`) or a percent of them (`25%`, 0-100%)",
        );
        return None;
    }
    u32_in(ctx, node, what, 0, 1000).map(Amount::Count)
}

/// `gates: {maxErrorPercent: 5, maxP95Ms: 500, minRequests: 20}`: at least one threshold.
pub(super) fn decode_gates(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<CanaryGate> {
    let f = Fields::new(ctx, node, "`rollout.gates`", GATE_FIELDS)?;
    let errors = match f.get("maxErrorPercent") {
        None => Some(None),
        Some(n) => crate::decode::int_in(ctx, n, "`maxErrorPercent`", 0, 100)
            .and_then(|v| u8::try_from(v).ok())
            .map(Some),
    };
    let p95 = match f.get("maxP95Ms") {
        None => Some(None),
        Some(n) => u32_in(ctx, n, "`maxP95Ms`", 1, 600_000).map(Some),
    };
    let min = f.get("minRequests").map_or(Some(defaults::GATE_MIN_REQUESTS), |n| {
        u32_in(ctx, n, "`minRequests`", 1, 1_000_000)
    });
    let (errors, p95, min) = (errors?, p95?, min?);
    if errors.is_none() && p95.is_none() {
        ctx.error_hint(
            Code::MissingField,
            f.pos,
            "`rollout.gates` sets no threshold".to_owned(),
            "`maxErrorPercent` (5xx of the new release's requests), `maxP95Ms`, or both",
        );
        return None;
    }
    Some(CanaryGate {
        max_error_percent: errors,
        max_p95_ms: p95,
        min_requests: min,
    })
}

/// `steps: [{weight: 10, pause: 60s}, …]`: weights 1-99 percent, each above the one before,
/// at most [`defaults::MAX_CANARY_STEPS`]; `pause` in seconds (`90`, `90s`, `5m`, `1h`), at
/// most a day; none: until `pl rollout promote`.
pub(super) fn decode_canary_steps(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Vec<CanaryStep>> {
    let items = crate::decode::seq(ctx, node, "`rollout.steps`")?;
    if items.is_empty() || items.len() > defaults::MAX_CANARY_STEPS {
        ctx.error(
            Code::OutOfRange,
            node.pos,
            format!(
                "`rollout.steps` has {} steps; a canary has 1-{}",
                items.len(),
                defaults::MAX_CANARY_STEPS
            ),
        );
        return None;
    }
    let mut out = Some(Vec::with_capacity(items.len()));
    let mut last = 0u8;
    for item in items {
        let step = (|| {
            let f = Fields::new(ctx, item, "a step of `rollout.steps`", CANARY_STEP_FIELDS)?;
            let Some(w) = f.get("weight") else {
                ctx.error_hint(
                    Code::MissingField,
                    f.pos,
                    "a step of `rollout.steps` needs `weight`".to_owned(),
                    "the percent of requests the new release gets at this step, 1-99",
                );
                return None;
            };
            let weight = u8::try_from(crate::decode::int_in(ctx, w, "`weight`", 1, 99)?).ok()?;
            if weight <= last {
                ctx.error_hint(
                    Code::InvalidValue,
                    w.pos,
                    format!("`weight` is {weight}, not above the step before's {last}"),
                    "each step sends more requests to the new release than the one before",
                );
                return None;
            }
            last = weight;
            let pause_seconds = match f.get("pause") {
                None => None,
                Some(p) => Some(pause(ctx, p)?),
            };
            Some(CanaryStep { weight, pause_seconds })
        })();
        match (step, out.as_mut()) {
            (Some(s), Some(v)) => v.push(s),
            _ => out = None,
        }
    }
    out
}

/// A pause: seconds as an integer, or a number with `s`, `m` or `h`; 1 s to a day.
pub(super) fn pause(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<u32> {
    let what = "`pause`";
    let seconds = match &node.value {
        yaml::Value::Int(v) => Some(*v),
        yaml::Value::Str(s) => {
            let s: &str = s.as_ref();
            let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let scale = match unit {
                "" | "s" => Some(1),
                "m" => Some(60),
                "h" => Some(3600),
                _ => None,
            };
            digits.parse::<i64>().ok().zip(scale).map(|(n, k)| n.saturating_mul(k))
        }
        _ => None,
    };
    let max = i64::from(defaults::MAX_PAUSE_SECONDS);
    match seconds {
        Some(n) if (1..=max).contains(&n) => u32::try_from(n).ok(),
        Some(n) => {
            ctx.error(
                Code::OutOfRange,
                node.pos,
                format!("{what} is {n} s; it must be 1-{max} s"),
            );
            None
        }
        None => {
            ctx.error_hint(
                Code::InvalidValue,
                node.pos,
                format!("{what} is not a duration"),
                "seconds (`90`), or a number with s, m or h (`90s`, `5m`, `1h`); leave it out to wait for `pl rollout promote`",
            );
            None
        }
    }
}
