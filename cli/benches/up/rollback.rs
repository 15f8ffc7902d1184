//! `pl rollback` of a 10-replica web role against a fresh rollout of the old image, what a plain
//! Git revert gets today (the project file back to the old image and `pl up`: the revert as a
//! local revision, judged, rolled out), alternating in the same run on one local control plane.
//! Two figures each: the switch, from the command to every request answered by the previous
//! release (requests in a loop from the command's start, bounded in count and time; the time of
//! the first of 20 answers in a row from it), and the command's return (once every replica of
//! the previous release runs and none of the other, after the ingress's 1 s drain and the
//! cleanup). Between samples the hold is released (`pl rollback --release`) or the newer
//! release rolled out again, so each sample starts from the newer release serving with the
//! older one stopped on the node.

use super::*;

const REPLICAS: u32 = 10;

fn project(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: {REPLICAS}, command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]}}\n"
    )
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into()
}

fn body(agent: &ureq::Agent, port: u16, host: &str) -> Option<String> {
    agent
        .get(&format!("http://127.0.0.1:{port}/"))
        .header("Host", host)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
}

/// Whether `n` requests in a row are each answered 200 with `want`.
fn all_answer(port: u16, host: &str, want: &str, n: usize) -> bool {
    let agent = agent();
    (0..n).all(|_| body(&agent, port, host).is_some_and(|b| b == want))
}

/// Runs `cmd` while requests go in a loop (at most 20,000, 60 s): (the switch: when the first
/// of 20 answers in a row with `want` came, from the start; the command's return).
fn switch(cmd: &mut Command, port: u16, host: &str, want: &str) -> (Duration, Duration) {
    let agent = agent();
    let started = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("runs");
    let (mut run, mut first) = (0, None);
    for _ in 0..20_000 {
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
        let at = started.elapsed();
        if body(&agent, port, host).is_some_and(|b| b == want) {
            if run == 0 {
                first = Some(at);
            }
            run += 1;
            if run == 20 {
                break;
            }
        } else {
            run = 0;
        }
    }
    let status = child.wait().expect("waits");
    let returned = started.elapsed();
    assert!(status.success(), "{cmd:?} failed");
    (first.expect("the previous release answered"), returned)
}

pub fn bench(host: &Host, registry_port: u16, pl: &Path, rounds: usize, work: &Path) -> String {
    let one = host.image(
        registry_port,
        "rb-one",
        &[("/www/index.html", "one\n"), ("/www/healthz", "ok\n")],
    );
    let two = host.image(
        registry_port,
        "rb-two",
        &[("/www/index.html", "two\n"), ("/www/healthz", "ok\n")],
    );
    let dir = work.join("rollback");
    std::fs::create_dir_all(&dir).expect("dir");
    let repo = Repo::new(&dir);
    repo.write("projects/api.yaml", &project(&one));
    repo.write("envs/api.yaml", &environment("api-production", "api"));
    let state = dir.join("pl-state");
    let (pl, socket, repo_dir) = (pl.to_owned(), host.socket.clone(), repo.dir.clone());
    let (ours, theirs) = host.run(move || {
        let run = |args: &[&str]| {
            let mut c = Command::new(&pl);
            c.args(args)
                .arg(&repo_dir)
                .env("PL_STATE_DIR", &state)
                .env("PL_DOCKER_SOCKET", &socket);
            c
        };
        let up = || run(&["up", "--http", "--node", "n1", "--port", "18092"]);
        let release = |image: &str| {
            std::fs::write(repo_dir.join("projects/api.yaml"), project(image)).expect("write");
            timed(&mut up())
        };
        let host = "api.example.com.localhost";
        timed(&mut up());
        release(&two);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Ours: the hold, then released (release two again).
            let a = switch(&mut run(&["rollback", "api-production", "--local"]), 18_092, host, "one\n");
            assert!(all_answer(18_092, host, "one\n", 50), "rolled back: release one answers");
            timed(&mut run(&["rollback", "--release", "api-production", "--local"]));
            assert!(all_answer(18_092, host, "two\n", 20), "released: release two answers");
            // Theirs: the revert of the project file, then release two again.
            std::fs::write(repo_dir.join("projects/api.yaml"), project(&one)).expect("write");
            let b = switch(&mut up(), 18_092, host, "one\n");
            assert!(all_answer(18_092, host, "one\n", 50), "reverted: release one answers");
            release(&two);
            eprintln!(
                "round {round}: pl rollback switched in {:.2} s (returned in {:.2} s), a fresh rollout of the old image {:.2} s ({:.2} s)",
                a.0.as_secs_f64(),
                a.1.as_secs_f64(),
                b.0.as_secs_f64(),
                b.1.as_secs_f64()
            );
            ours.push(a);
            theirs.push(b);
        }
        timed(&mut run(&["down"]));
        (ours, theirs)
    });
    let (mut a0, mut a1): (Vec<Duration>, Vec<Duration>) = ours.into_iter().unzip();
    let (mut b0, mut b1): (Vec<Duration>, Vec<Duration>) = theirs.into_iter().unzip();
    let (a, ar, b, br) = (median(&mut a0), median(&mut a1), median(&mut b0), median(&mut b1));
    format!(
        "rollback of a {REPLICAS}-replica web role: every request answered by the previous release {a:.2} s after `pl rollback` (it returns at {ar:.2} s, the old replicas stopped), against {b:.2} s for a fresh rollout of the old image (the revert through pl up; returns at {br:.2} s): {:.2}x faster to the switch, {:.2}x to the return (median of {rounds})",
        b / a,
        br / ar
    )
}
