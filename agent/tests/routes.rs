//! The routes executor inside a network namespace this test makes (a simulated node with an
//! uplink to a gateway namespace, a "VPN" route in its main table, and environments' bridges):
//! the environment's rule and table appear, hold only its subnet and the default route (so
//! the VPN is out of its reach), read back, repair a route deleted by hand, refuse a foreign
//! rule or route at what would be theirs, and go away; the main and local tables of the node,
//! and the machine's own rules, never change.

use pushleft_agent::routes::{Routes, bridge_name};
use std::process::{Command, Stdio};

const NODE: &str = "plrt-node";
const GW: &str = "plrt-gw";

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `f` on a thread inside the node's namespace, with a runtime of its own there.
fn in_node<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{NODE}")).expect("netns");
        // This thread only: the test's own threads stay in the machine's namespace.
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread")
}

fn ensure(env: &'static str, subnet: &'static str) -> Result<String, pushleft_agent::outcome::Failure> {
    in_node(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt")
            .block_on(async { Routes::connect()?.ensure(env, subnet, None).await })
    })
}

fn remove(subnet: &'static str) -> Result<String, pushleft_agent::outcome::Failure> {
    in_node(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt")
            .block_on(async { Routes::connect()?.remove(subnet).await })
    })
}

struct Lab;
impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [NODE, GW] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn an_environment_gets_its_own_table_and_rule_and_nothing_else_changes() {
    let host_rules = sh("ip rule");
    for ns in [NODE, GW] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
    }
    let _lab = Lab;
    sh(&format!("ip netns exec {NODE} sysctl -qw net.ipv4.ip_forward=1"));
    sh(&format!(
        "ip -n {NODE} link add up0 type veth peer name eth0 netns {GW} && ip -n {NODE} addr add 198.51.100.1/24 dev up0 && ip -n {NODE} link set up0 up \
         && ip -n {GW} addr add 198.51.100.254/24 dev eth0 && ip -n {GW} link set eth0 up \
         && ip -n {NODE} route add default via 198.51.100.254 \
         && ip -n {NODE} link add vpn0 type veth peer name vpn1 && ip -n {NODE} link set vpn0 up && ip -n {NODE} link set vpn1 up && ip -n {NODE} route add 10.50.0.0/16 dev vpn0"
    ));
    for (i, (env, addr)) in [
        ("env-a", "10.208.5.1/24"),
        ("env-b", "10.208.7.1/24"),
        ("env-c", "10.208.8.1/24"),
    ]
    .into_iter()
    .enumerate()
    {
        // A bridge with one port (a container's end of a veth), so it has a carrier.
        let b = bridge_name(env);
        sh(&format!(
            "ip -n {NODE} link add {b} type bridge && ip -n {NODE} addr add {addr} dev {b} \
             && ip -n {NODE} link add port{i} type veth peer name peer{i} && ip -n {NODE} link set port{i} master {b} up \
             && ip -n {NODE} link set peer{i} up && ip -n {NODE} link set {b} up"
        ));
    }
    let main = sh(&format!("ip -n {NODE} route show table main"));
    let local = sh(&format!("ip -n {NODE} route show table local"));

    let note = ensure("env-a", "10.208.5.0/24").expect("ensure");
    assert!(note.contains("read back"), "{note}");
    ensure("env-a", "10.208.5.0/24").expect("idempotent");
    let rules = sh(&format!("ip -n {NODE} rule"));
    assert!(rules.contains("10005:\tfrom 10.208.5.0/24 lookup 10005"), "{rules}");
    let table = sh(&format!("ip -n {NODE} route show table 10005"));
    let ba = bridge_name("env-a");
    assert!(
        table.contains(&format!("10.208.5.0/24 dev {ba} proto 122 scope link")),
        "{table}"
    );
    assert!(
        table.contains("default via 198.51.100.254 dev up0 proto 122"),
        "{table}"
    );
    assert!(
        !table.contains("10.50."),
        "the VPN is out of the environment's reach: {table}"
    );
    // What the environment's packets would take: the VPN address goes to the default route.
    // (A new bridge takes a moment to come up; the lookup is retried for up to 5 s.)
    let lookup = format!("ip -n {NODE} route get 10.50.0.1 from 10.208.5.2 iif {ba}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !Command::new("sh")
        .arg("-c")
        .arg(&lookup)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(std::time::Instant::now() < deadline, "{lookup} keeps failing");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let path = sh(&lookup);
    assert!(
        path.contains("via 198.51.100.254") && path.contains("table 10005"),
        "{path}"
    );
    let host_path = sh(&format!("ip -n {NODE} route get 10.50.0.1"));
    assert!(
        host_path.contains("dev vpn0"),
        "the node itself still uses its VPN: {host_path}"
    );

    // A route deleted by hand is repaired.
    sh(&format!("ip -n {NODE} route del default table 10005"));
    ensure("env-a", "10.208.5.0/24").expect("repair");
    assert!(sh(&format!("ip -n {NODE} route show table 10005")).contains("default via 198.51.100.254"));

    // A rule at env-b's priority that is not ours, a route of another protocol in env-c's
    // table: refused, left alone.
    sh(&format!(
        "ip -n {NODE} rule add priority 10007 from 10.1.0.0/16 lookup main"
    ));
    assert_eq!(
        ensure("env-b", "10.208.7.0/24").expect_err("foreign rule").code,
        "foreign-rule"
    );
    assert!(sh(&format!("ip -n {NODE} rule")).contains("10007:\tfrom 10.1.0.0/16 lookup main"));
    sh(&format!(
        "ip -n {NODE} route add 10.9.0.0/16 dev vpn0 table 10008 proto static"
    ));
    assert_eq!(
        ensure("env-c", "10.208.8.0/24").expect_err("foreign route").code,
        "foreign-route"
    );
    assert!(sh(&format!("ip -n {NODE} route show table 10008")).contains("10.9.0.0/16"));

    // Removed: the rule and the table are gone; main and local never changed.
    assert!(remove("10.208.5.0/24").expect("remove").contains("2 routes"));
    assert!(!sh(&format!("ip -n {NODE} rule")).contains("10005"));
    assert_eq!(sh(&format!("ip -n {NODE} route show table 10005")), "");
    assert!(remove("10.208.5.0/24").expect("again").contains("0 routes"));
    assert_eq!(sh(&format!("ip -n {NODE} route show table main")), main);
    assert_eq!(sh(&format!("ip -n {NODE} route show table local")), local);
    assert_eq!(sh("ip rule"), host_rules, "the machine's own rules");
}
