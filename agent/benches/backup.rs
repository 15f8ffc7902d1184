//! Bench (a binary: each sample writes and reads a gibibyte): a 1 GiB volume (incompressible,
//! 64 files of 16 MiB) saved by the agent's backup executor (repository opened, the replica
//! paused, `restic backup`, unpaused) against `restic backup` of the same folder run by hand,
//! each into a fresh local repository; then restored by the executor (into a new volume
//! generation) against `restic restore` by hand into a fresh folder. Alternating, in the
//! same run; the target is within 1.2× of restic by hand.
//!
//! `cargo bench -p pushleft-agent --bench backup` (needs what `scripts/test` installs and a
//! dockerd; `-- --rounds N`, default 3).

#[path = "../tests/support/docker.rs"]
mod docker_support;
#[path = "../tests/support/mod.rs"]
mod support;

use agent_proto::{ApplicationSpec, NetworkSpec, VolumeMount};
use docker_support::{Registry, clean, docker, require_dockerd};
use pushleft_agent::docker::BackupOf;
use pushleft_agent::restic::{Repository, Restic};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const ENV: &str = "plbench-backup";
const FILES: usize = 64;
const FILE_BYTES: usize = 16 << 20;

fn replica(image: &str, net: &NetworkSpec) -> ApplicationSpec {
    ApplicationSpec {
        resume: None,
        command: [
            "/bin/sh",
            "-c",
            "echo ok > /data/healthz && exec /bin/httpd -f -p 8080 -h /data",
        ]
        .map(String::from)
        .to_vec(),
        volumes: vec![VolumeMount {
            volume: "data".into(),
            generation: 1,
            path: "/data".into(),
            load: None,
        }],
        ..docker_support::web_replica("0123abcd", ENV, "db", 0, image, 1, net)
    }
}

/// Fills `dir` with incompressible files (a xorshift stream: no deduplication, no
/// compression to flatter either side).
fn fill(dir: &Path) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; FILE_BYTES];
    for i in 0..FILES {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let mut f = std::fs::File::create(dir.join(format!("file-{i:02}"))).expect("file");
        f.write_all(&buf).expect("write");
    }
}

fn restic_by_hand(repo: &Path, password: &Path, args: &[&str], cwd: &Path) -> Duration {
    let started = Instant::now();
    let o = Command::new("restic")
        .args([
            "--repo",
            &repo.to_string_lossy(),
            "--password-file",
            &password.to_string_lossy(),
        ])
        .args(args)
        .current_dir(cwd)
        .env("RESTIC_CACHE_DIR", repo.with_extension("cache"))
        .output()
        .expect("restic");
    assert!(
        o.status.success(),
        "restic {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut rounds = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args.next().expect("rounds").parse().expect("number");
        }
    }
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("backup-bench", &[("/www/healthz", "ok\n")]);
    clean(ENV);
    let dir = tempfile::tempdir().expect("tempdir");
    let password = dir.path().join("password");
    std::fs::write(&password, "bench password\n").expect("password");
    let restic = Restic {
        program: "restic".into(),
        timeout: Duration::from_secs(3600),
    };
    let rt = support::runtime();
    let (ours, by_hand, ours_restore, hand_restore) = rt.block_on(async {
        let engine = docker_support::engine_n1(dir.path(), "0123abcd").await;
        let net = NetworkSpec {
            environment: ENV.into(),
            network: format!("pl_{ENV}"),
            subnet: "10.208.245.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");
        let app = replica(&image, &net);
        engine.ensure_application(&app).await.expect("replica");
        let mount = app.volumes[0].clone();
        let volume_dir = docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &engine.volume_name(ENV, &mount),
        ]);
        let volume_dir = std::path::PathBuf::from(volume_dir);
        fill(&volume_dir);
        let tags = vec![format!("pl-environment={ENV}"), "pl-volume=data".to_owned()];
        let (mut ours, mut by_hand, mut ours_restore, mut hand_restore) = (vec![], vec![], vec![], vec![]);
        for round in 0..rounds {
            // By hand: a fresh repository, `restic init`, `restic backup .` in the folder.
            let hand_repo = dir.path().join(format!("hand-{round}"));
            let t = restic_by_hand(&hand_repo, &password, &["init", "--quiet"], dir.path())
                + restic_by_hand(&hand_repo, &password, &["backup", "--quiet", "."], &volume_dir);
            by_hand.push(t);
            // Ours: a fresh repository made by the executor, the replica paused meanwhile.
            let repo = Repository {
                location: dir.path().join(format!("ours-{round}")).to_string_lossy().into_owned(),
                password_file: password.clone(),
                env: Default::default(),
                cache_dir: dir.path().join(format!("ours-{round}.cache")),
            };
            let started = Instant::now();
            let summary = engine
                .backup_volume(
                    &restic,
                    &repo,
                    &BackupOf {
                        environment: ENV,
                        mount: &mount,
                        container: Some(&app.container),
                        command: None,
                        tags: &tags,
                    },
                )
                .await
                .expect("backup");
            ours.push(started.elapsed());
            assert!(summary.bytes >= (FILES * FILE_BYTES) as u64, "{summary:?}");
            // Restores: by hand into a fresh folder; ours into a new volume generation.
            let target = dir.path().join(format!("restored-{round}"));
            let latest = restic
                .snapshots(&repo, &tags)
                .await
                .expect("snapshots")
                .pop()
                .expect("one")
                .id;
            hand_restore.push(restic_by_hand(
                &hand_repo,
                &password,
                &["restore", "latest", "--target", &target.to_string_lossy(), "--quiet"],
                dir.path(),
            ));
            std::fs::remove_dir_all(&target).expect("clean");
            let next = VolumeMount {
                generation: 2 + round as u64,
                ..mount.clone()
            };
            let started = Instant::now();
            engine
                .restore_volume(&restic, &repo, ENV, &next, &latest)
                .await
                .expect("restore");
            ours_restore.push(started.elapsed());
            docker(&["volume", "rm", &engine.volume_name(ENV, &next)]);
            std::fs::remove_dir_all(&repo.location).expect("clean");
            std::fs::remove_dir_all(&hand_repo).expect("clean");
        }
        (ours, by_hand, ours_restore, hand_restore)
    });
    clean(ENV);
    let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let (o, h, or, hr) = (
        median(ours),
        median(by_hand),
        median(ours_restore),
        median(hand_restore),
    );
    println!("Medians of {rounds} rounds, 1 GiB in {FILES} files, a fresh local repository each:");
    println!();
    println!("| | Pushleft's executor | restic by hand | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| backup | {} | {} | {:.2} |",
        s(o),
        s(h),
        o.as_secs_f64() / h.as_secs_f64()
    );
    println!(
        "| restore | {} | {} | {:.2} |",
        s(or),
        s(hr),
        or.as_secs_f64() / hr.as_secs_f64()
    );
}
