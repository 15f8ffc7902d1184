//! `pl rollback` of a 10-replica web role, from the command to every replica of the previous
//! release running and none of the rolled-back one (`pl rollback` returns only then; a burst
//! of requests then checks that each is answered by the previous release), against a fresh
//! rollout of the old image, what a plain Git revert gets today: the project file back to the
//! old image and `pl up` (the revert as a local revision, judged, rolled out, followed to the
//! same end), alternating in the same run on one local control plane. Between samples the
//! hold is released (`pl rollback --release`) or the newer release rolled out again, so each
//! sample starts from the newer release serving with the older one stopped on the node.

use super::*;

const REPLICAS: u32 = 10;

fn project(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: {REPLICAS}, command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]}}\n"
    )
}

/// Whether `n` requests in a row are each answered 200 with `body`.
fn all_answer(port: u16, host: &str, body: &str, n: usize) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    (0..n).all(|_| {
        agent
            .get(&format!("http://127.0.0.1:{port}/"))
            .header("Host", host)
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .is_some_and(|b| b == body)
    })
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
    let state = dir.join("state");
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
            let a = timed(&mut run(&["rollback", "api-production", "--local"]));
            assert!(
                all_answer(18_092, host, "one\n", 50),
                "rolled back: release one answers"
            );
            timed(&mut run(&["rollback", "--release", "api-production", "--local"]));
            assert!(all_answer(18_092, host, "two\n", 20), "released: release two answers");
            // Theirs: the revert of the project file, then release two again.
            let b = release(&one);
            assert!(all_answer(18_092, host, "one\n", 50), "reverted: release one answers");
            release(&two);
            eprintln!(
                "round {round}: pl rollback {:.2} s, a fresh rollout of the old image {:.2} s",
                a.as_secs_f64(),
                b.as_secs_f64()
            );
            ours.push(a);
            theirs.push(b);
        }
        timed(&mut run(&["down"]));
        (ours, theirs)
    });
    let (mut ours, mut theirs) = (ours, theirs);
    let (a, b) = (median(&mut ours), median(&mut theirs));
    format!(
        "rollback of a {REPLICAS}-replica web role: pl rollback {a:.2} s, a fresh rollout of the old image (the revert through pl up) {b:.2} s, {:.2}x faster (median of {rounds})",
        b / a
    )
}
