//! A job's idempotency key (`task.rs`) said in words for people: `app:shop/web/0:g2:stop@n1`
//! reads `stop web replica 0 of generation 2 on n1`. Keys stay what the ledger and the agent
//! use; this is only how `pl` shows them. An unknown shape is shown as the key itself.

/// `key` in words, or the key itself when its shape is not one `task.rs` makes.
pub fn describe(key: &str) -> String {
    words(key).unwrap_or_else(|| key.to_owned())
}

fn words(key: &str) -> Option<String> {
    let (what, node) = match key.rsplit_once('@') {
        Some((what, node)) => (what, Some(node)),
        None => (key, None),
    };
    let on = node.map(|n| format!(" on {n}")).unwrap_or_default();
    let (kind, rest) = what.split_once(':')?;
    // `<subject>:g<generation>:<verb>` for most kinds.
    let generation_verb = |rest: &str| -> Option<(String, u64, String)> {
        let (subject, tail) = rest.split_once(":g")?;
        let (generation, verb) = tail.split_once(':')?;
        Some((subject.to_owned(), generation.parse().ok()?, verb.to_owned()))
    };
    let text = match kind {
        "app" => {
            let (subject, generation, verb) = generation_verb(rest)?;
            let mut parts = subject.splitn(3, '/');
            let (_env, role, index) = (parts.next()?, parts.next()?, parts.next()?);
            let replica = format!("{role} replica {index} of generation {generation}");
            match verb.split_once('#') {
                Some(("ensure", repair)) => {
                    format!("make {replica} again (repair {})", repair.trim_start_matches('r'))
                }
                _ => match verb.as_str() {
                    "ensure" => format!("start {replica}"),
                    "stop" => format!("stop {replica}"),
                    "teardown" => format!("remove {replica}"),
                    _ => return None,
                },
            }
        }
        "once" => {
            let (subject, generation, _) = generation_verb(rest)?;
            let role = subject.split('/').nth(1)?;
            format!("run release role {role} of generation {generation}")
        }
        "env" => {
            let (_env, generation, verb) = generation_verb(rest)?;
            match verb.as_str() {
                "ensure" => format!("set up the network, firewall and routes of generation {generation}"),
                _ => return None,
            }
        }
        "net" | "fw" | "routes" => {
            let (_env, generation, verb) = generation_verb(rest)?;
            let thing = match kind {
                "net" => "network",
                "fw" => "firewall",
                _ => "routes",
            };
            match verb.as_str() {
                "ensure" | "apply" => format!("set up the {thing} of generation {generation}"),
                "remove" => format!("remove the {thing} of generation {generation}"),
                _ => return None,
            }
        }
        "ingress" => {
            let (subject, generation, verb) = generation_verb(rest)?;
            let hostname = subject.split_once('/').map(|(_, h)| h)?;
            match verb.split_once(['/', '#']) {
                Some(("publish", w)) if w.starts_with('w') => format!(
                    "route {}% of {hostname} to generation {generation} (canary)",
                    w.trim_start_matches('w')
                ),
                Some(("publish", b)) if b.starts_with('b') => {
                    format!("route {hostname} to generation {generation} (rolling batch)")
                }
                Some(("publish", r)) if r.starts_with('r') => {
                    format!("route {hostname} to generation {generation} again (repair)")
                }
                _ => match verb.as_str() {
                    "publish" => format!("route {hostname} to generation {generation}"),
                    "remove" => format!("remove the routes of {hostname}"),
                    _ => return None,
                },
            }
        }
        "cron" => {
            let role = rest.split('/').nth(1)?.split(':').next()?;
            format!("run scheduled role {role}")
        }
        "backup" => format!("back up volume {}", rest.split('/').nth(1)?.split(':').next()?),
        "drill" => format!(
            "prove volume {}'s newest backup restores",
            rest.split('/').nth(1)?.split(':').next()?
        ),
        "vol" => format!("remove volume {}", rest.split('/').nth(1)?.split(':').next()?),
        _ => return None,
    };
    Some(format!("{text}{on}"))
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn keys_read_as_words() {
        assert_eq!(
            describe("app:shop/web/0:g2:stop@n1"),
            "stop web replica 0 of generation 2 on n1"
        );
        assert_eq!(
            describe("app:shop/web/1:g3:ensure"),
            "start web replica 1 of generation 3"
        );
        assert_eq!(
            describe("app:shop/web/1:g3:ensure#r2@n2"),
            "make web replica 1 of generation 3 again (repair 2) on n2"
        );
        assert_eq!(
            describe("ingress:shop/shop.example.com:g4:publish/w50@n1"),
            "route 50% of shop.example.com to generation 4 (canary) on n1"
        );
        assert_eq!(
            describe("ingress:shop/shop.example.com:g4:publish@n1"),
            "route shop.example.com to generation 4 on n1"
        );
        assert_eq!(
            describe("once:shop/migrate:g4:run@n1"),
            "run release role migrate of generation 4 on n1"
        );
        assert_eq!(
            describe("fw:shop:g4:apply@n1"),
            "set up the firewall of generation 4 on n1"
        );
        assert_eq!(
            describe("env:shop:g4:ensure@n1"),
            "set up the network, firewall and routes of generation 4 on n1"
        );
        assert_eq!(describe("env:shop:g4:remove@n1"), "env:shop:g4:remove@n1");
        assert_eq!(describe("something:else"), "something:else");
    }
}
