//! examples/app (PostgreSQL as a service on a volume, two web replicas, a worker) brought up by
//! `pl up --http` against `docker compose up -d --wait` of the same three services (the same
//! image by digest, warm in the engine's cache; the same hardening; a named volume; health
//! checks probed every 200 ms), alternating in the same run, each round on a fresh volume (so
//! both sides make a new PostgreSQL cluster). `pl up` counts until its web role answers, which
//! its health check allows only once the database answers.

use super::*;

fn compose_file(dir: &Path, image: &str) -> PathBuf {
    let hardening = "    init: true\n    read_only: true\n    cap_drop: [ALL]\n    security_opt: [no-new-privileges]\n    tmpfs: [/tmp]\n";
    let web = |i: usize| {
        format!(
            "  web{i}:\n    image: {image}\n    pull_policy: missing\n{hardening}    command: [/bin/httpd, -f, -p, \"8080\", -h, /www]\n    healthcheck:\n      test: [CMD, /bin/busybox, wget, -q, -O, /dev/null, \"http://127.0.0.1:8080/cgi-bin/healthz\"]\n      interval: 200ms\n      timeout: 2s\n      retries: 300\n"
        )
    };
    let text = format!(
        "services:\n  db:\n    image: {image}\n    pull_policy: missing\n{hardening}    command: [/bin/db]\n    volumes: [pgdata:/var/lib/postgresql/data]\n    healthcheck:\n      test: [CMD, /bin/pg_isready, -h, /tmp, -q]\n      interval: 200ms\n      timeout: 2s\n      retries: 300\n{}{}  worker:\n    image: {image}\n    pull_policy: missing\n{hardening}    command: [/bin/worker]\nvolumes:\n  pgdata: {{}}\n",
        web(0),
        web(1)
    );
    let path = dir.join("compose-app.yaml");
    std::fs::write(&path, text).expect("compose file");
    path
}

/// The example's repository with `image` for its placeholder and `dir`'s identity for its
/// placeholders' (as scripts/example-app does); the identity file.
fn repository(repo: &Path, image: &str, state: &Path) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace");
    assert!(
        Command::new("cp")
            .arg("-r")
            .arg(workspace.join("examples/app"))
            .arg(repo)
            .status()
            .expect("cp")
            .success()
    );
    let key = repo.with_extension("key");
    assert!(
        Command::new("age-keygen")
            .arg("-o")
            .arg(&key)
            .output()
            .expect("age-keygen")
            .status
            .success()
    );
    let o = Command::new("age-keygen")
        .arg("-y")
        .arg(&key)
        .output()
        .expect("age-keygen -y");
    let recipient = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let root = std::fs::read_to_string(repo.join("pushleft.yaml")).expect("root");
    let placeholder = root
        .lines()
        .find_map(|l| l.trim().strip_prefix("controlRecipient: "))
        .expect("a control recipient")
        .to_owned();
    std::fs::write(repo.join("pushleft.yaml"), root.replace(&placeholder, &recipient)).expect("root");
    std::fs::write(
        repo.join("secrets/app-backups.yaml"),
        format!("apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: app-backups\nspec:\n  recipients:\n    - {recipient}\n"),
    )
    .expect("secret");
    let pl = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/pl");
    let pl = if pl.exists() {
        pl
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/pl")
    };
    let mut set = Command::new(pl)
        .args(["secret", "set", "app-backups", "RESTIC_PASSWORD", "-C"])
        .arg(repo)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("pl secret set");
    std::io::Write::write_all(&mut set.stdin.take().expect("stdin"), b"bench").expect("value");
    assert!(set.wait().expect("pl secret set").success());
    let project = repo.join("projects/app.yaml");
    let text = std::fs::read_to_string(&project).expect("project");
    let line = text
        .lines()
        .find(|l| l.trim().starts_with("image: "))
        .expect("image line")
        .to_owned();
    std::fs::write(&project, text.replace(&line, &format!("  image: {image}"))).expect("project");
    let env_file = repo.join("environments/app-production.yaml");
    let text = std::fs::read_to_string(&env_file).expect("environment");
    std::fs::write(
        &env_file,
        text.replace(
            "/var/backups/pushleft/example-app",
            &state.join("backups/app").to_string_lossy(),
        ),
    )
    .expect("environment");
    key
}

pub fn bench(host: &Host, registry_port: u16, pl: &Path, rounds: usize, work: &Path) -> String {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace");
    let context = work.join("app-image");
    let o = Command::new("bash")
        .arg(workspace.join("scripts/app-image"))
        .arg(&context)
        .output()
        .expect("scripts/app-image");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tag = format!("127.0.0.1:{registry_port}/pl-host/app:latest");
    host.docker(&["build", "-q", "-t", &tag, &context.to_string_lossy()]);
    host.docker(&["push", &tag]);
    let image = host.docker(&["inspect", "--format", "{{index .RepoDigests 0}}", &tag]);
    let dir = work.join("app");
    std::fs::create_dir_all(&dir).expect("dir");
    let file = compose_file(&dir, &image);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let state = dir.join(format!("state-{round}"));
        let repo = dir.join(format!("repo-{round}"));
        let key = repository(&repo, &image, &state);
        let (pl, socket, file) = (pl.to_owned(), host.socket.clone(), file.clone());
        let (a, b) = host.run(move || {
            let a = timed(
                Command::new(&pl)
                    .args(["up", "--http", "--node", "node-1", "--port", "18091", "--identity"])
                    .arg(&key)
                    .arg(&repo)
                    .env("PL_STATE_DIR", &state)
                    .env("PL_DOCKER_SOCKET", &socket),
            );
            assert!(
                serves_plain(18_091, "app.apps.example.com.localhost"),
                "the example serves"
            );
            timed(
                Command::new(&pl)
                    .arg("down")
                    .arg(&repo)
                    .env("PL_STATE_DIR", &state)
                    .env("PL_DOCKER_SOCKET", &socket),
            );
            let volumes = host_support::docker_at(
                &socket,
                &[
                    "volume",
                    "ls",
                    "-q",
                    "--filter",
                    "label=dev.pushleft.environment=app-production",
                ],
            );
            for v in volumes.lines() {
                host_support::docker_at(&socket, &["volume", "rm", v]);
            }
            let compose = |args: &[&str]| {
                let mut c = Command::new("docker-compose");
                c.arg("-f")
                    .arg(&file)
                    .args(["-p", "plbenchapp"])
                    .args(args)
                    .env("DOCKER_HOST", format!("unix://{}", socket.display()));
                c
            };
            let b = timed(&mut compose(&["up", "-d", "--wait", "--quiet-pull"]));
            timed(&mut compose(&["down", "-v", "-t", "1"]));
            (a, b)
        });
        eprintln!(
            "example app: pl up {:.2} s, compose {:.2} s",
            a.as_secs_f64(),
            b.as_secs_f64()
        );
        ours.push(a);
        theirs.push(b);
    }
    let (a, b) = (median(&mut ours), median(&mut theirs));
    format!(
        "examples/app (PostgreSQL on a new volume, 2 web, a worker): pl up --http {a:.2} s (cold: the control plane starts too), docker compose up -d --wait {b:.2} s, ratio {:.2} (median of {rounds})",
        a / b
    )
}
