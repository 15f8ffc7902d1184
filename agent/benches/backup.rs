//! Bench (a binary: each sample writes and reads a gibibyte): a 1 GiB volume (incompressible,
//! 64 files of 16 MiB) saved by the agent's backup executor (repository opened, the replica
//! paused, `restic backup`, unpaused) against `restic backup` of the same folder run by hand,
//! each into a fresh local repository; then restored by the executor (into a new volume
//! generation) against `restic restore` by hand into a fresh folder. Alternating, in the
//! same run; the target is within 1.2× of restic by hand.
//!
//! Then the whole scheduled-backup job at steady state (`Engine::backup`, what a
//! `backup-volume` task runs: the sealed password opened, the repository, the replica paused,
//! `restic backup`, unpaused, done; its retention runs after the report) on about 200 MB (12
//! files of 16 MiB, one of them new each round) into a repository that already holds
//! snapshots, against `restic backup .` of the same folder by hand into one of its own, as the
//! end-to-end run that found 1.69× measured it.
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
        image_trust: None,
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
    let (ours, by_hand, ours_restore, hand_restore, job, job_hand) = rt.block_on(async {
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
        // The job at steady state: about 200 MB, one file new each round.
        for i in 12..FILES {
            std::fs::remove_file(volume_dir.join(format!("file-{i:02}"))).expect("trim");
        }
        let identity = dir.path().join("age.key");
        let recipient = support::age_keygen(&identity);
        let backups = pushleft_agent::docker::Backups {
            restic: restic.clone(),
            roots: vec![dir.path().to_owned()],
            cache_dir: dir.path().join("job-cache"),
        };
        let spec = agent_proto::BackupSpec {
            environment: ENV.into(),
            mount: mount.clone(),
            container: Some(app.container.clone()),
            command: None,
            stop_role: None,
            keep: 2,
            repository: dir.path().join("job").to_string_lossy().into_owned(),
            secret: "bench".into(),
            values: vec![agent_proto::SealedSecret {
                key: "RESTIC_PASSWORD".into(),
                sealed: support::age_encrypt("bench password", &recipient),
            }],
        };
        let hand_repo = dir.path().join("job-hand");
        restic_by_hand(&hand_repo, &password, &["init", "--quiet"], dir.path());
        let mut change = 0u64;
        let mut renew = |volume_dir: &Path| {
            change += 1;
            let mut x: u64 = 0x2545_f491_4f6c_dd1d ^ change;
            let mut buf = vec![0u8; FILE_BYTES];
            for chunk in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            std::fs::write(volume_dir.join("file-00"), &buf).expect("renew");
        };
        // Two untimed rounds first: the repositories hold snapshots, and retention has
        // something to forget, as on any day after the first.
        let (mut job, mut job_hand) = (vec![], vec![]);
        for round in 0..rounds + 2 {
            renew(&volume_dir);
            let t = restic_by_hand(&hand_repo, &password, &["backup", "--quiet", "."], &volume_dir);
            // The previous round's retention has ended (it holds the repository until then).
            drop(engine.hold_repository(&spec.repository).await);
            let started = Instant::now();
            engine.backup(&backups, &spec).await.expect("backup job");
            let o = started.elapsed();
            if round >= 2 {
                job_hand.push(t);
                job.push(o);
            }
        }
        drop(engine.hold_repository(&spec.repository).await);
        let job_repo = Repository {
            location: spec.repository.clone(),
            password_file: password.clone(),
            env: Default::default(),
            cache_dir: dir.path().join("job-cache"),
        };
        let kept = restic.snapshots(&job_repo, &[]).await.expect("snapshots");
        assert_eq!(kept.len(), 2, "retention kept `keep`");
        (ours, by_hand, ours_restore, hand_restore, job, job_hand)
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
    let (j, jh) = (median(job), median(job_hand));
    println!();
    println!("Medians of {rounds} rounds, about 200 MB (one 16 MiB file new each round), repositories with snapshots:");
    println!();
    println!("| | Pushleft's backup job | restic backup by hand | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| backup | {} | {} | {:.2} |",
        s(j),
        s(jh),
        j.as_secs_f64() / jh.as_secs_f64()
    );
}
