//! `pl`: validate, plan, show and scaffold Pushleft state repositories.

#[macro_use]
mod out;
mod args;
mod backups;
mod client;
mod commands;
mod image;
mod image_args;
mod image_engine;
mod image_push;
mod live;
mod operator;
mod rollback;
mod rollback_commit;
mod rollout;
mod secret;
mod status;
mod ui;
mod up;
mod verify;
mod volumes;
mod wait;

// Parsing ten thousand small files is allocation-bound; mimalloc is markedly faster there than
// glibc's allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod render;

use args::*;
use clap::Parser;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            // Usage errors exit 1 like every other error, so that 2 keeps meaning
            // "changes present" under --detailed-exitcode.
            return ExitCode::from(code);
        }
    };
    let colour = match (cli.no_color, cli.color) {
        (true, _) | (_, ColorChoice::Never) => false,
        (_, ColorChoice::Always) => true,
        (_, ColorChoice::Auto) => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stdout().is_terminal()
        }
    };
    let paint = render::Paint::new(colour);
    let dir = |d: Option<PathBuf>| d.unwrap_or_else(|| PathBuf::from("."));
    // Secret commands hold plaintext and identities: no core dumps, no ptrace.
    if matches!(cli.command, Command::Secret(_))
        && let Err(e) = pushleft_secrets::harden_process()
    {
        eprintln!(
            "{} cannot disable core dumps before handling secrets: {e}",
            paint.red("error:")
        );
        return ExitCode::from(1);
    }
    let result = match cli.command {
        Command::Validate {
            dir: d,
            rev,
            format,
            allowed_signers,
            policy,
        } => commands::validate(
            &dir(d),
            rev.as_deref(),
            format,
            (allowed_signers.as_deref(), policy.as_deref()),
            paint,
        ),
        Command::Image(ImageCommand::Sign {
            image,
            signing_key,
            dir: d,
        }) => image::sign(&dir(d), &image, signing_key.as_deref()),
        Command::Image(ImageCommand::Push {
            image,
            name,
            input,
            server,
        }) => control_plane(server).and_then(|s| image_push::push(&s, &image, name.as_deref(), input.as_deref())),
        Command::Image(ImageCommand::Gc { delete, server }) => {
            control_plane(server).and_then(|s| image_push::gc(&s, delete))
        }
        Command::Image(ImageCommand::Update {
            signing_key,
            registry_auth,
            dir: d,
        }) => image::update(&dir(d), signing_key.as_deref(), &registry_auth),
        Command::Plan(args) => match args
            .fleet
            .fleet
            .then(|| control_plane(args.fleet.server_args()))
            .transpose()
        {
            Ok(fleet) => commands::plan(&args, fleet.as_ref(), paint),
            Err(e) => Err(e),
        },
        Command::Show { dir: d, rev, format } => commands::show(&dir(d), rev.as_deref(), format, paint),
        Command::Verify {
            range,
            dir: d,
            allowed_signers,
            policy,
            at,
            format,
        } => verify::verify(
            &dir(d),
            &range,
            &allowed_signers,
            policy.as_deref(),
            at.as_deref(),
            format,
            paint,
        ),
        Command::Secret(cmd) => match cmd {
            SecretCommand::Set { name, key, dir: d } => secret::set(&dir(d), &name, &key),
            SecretCommand::Show {
                name,
                key,
                dir: d,
                identity,
            } => secret::show(&dir(d), &name, key.as_deref(), identity.as_deref()),
            SecretCommand::Edit { name, dir: d, identity } => secret::edit(&dir(d), &name, identity.as_deref()),
            SecretCommand::Recipients {
                name,
                add,
                remove,
                dir: d,
                identity,
            } => secret::recipients(&dir(d), &name, &add, &remove, identity.as_deref()),
        },
        Command::Schema => commands::schema(),
        Command::Init { dir: d } => commands::init(&dir(d)),
        Command::Up(args) => up::up(&args),
        Command::Down(args) => up::down(&args),
        Command::Status { server } => control_plane(server).and_then(|s| status::status(&s)),
        Command::Ui {
            sign_out_everywhere,
            server,
        } => control_plane(server).and_then(|s| ui::ui(&s, sign_out_everywhere)),
        Command::Wait(args) => {
            control_plane(args.server.clone()).and_then(|server| wait::wait(&wait::WaitArgs { server, ..args }))
        }
        Command::Events { after, follow, server } => {
            control_plane(server).and_then(|s| operator::events(&s, after, follow))
        }
        Command::Logs {
            environment,
            role,
            tail,
            follow,
            server,
        } => control_plane(server).and_then(|s| operator::logs(&s, &environment, &role, tail, follow)),
        Command::Jobs {
            state,
            environment,
            limit,
            server,
        } => control_plane(server).and_then(|s| operator::jobs(&s, state, environment, limit)),
        Command::Revisions {
            action: None,
            branch,
            limit,
            server,
        } => control_plane(server).and_then(|s| operator::revisions(&s, branch, limit)),
        Command::Revisions {
            action: Some(RevisionsAction::ApproveRewrite { branch, sha }),
            server,
            ..
        } => control_plane(server).and_then(|s| operator::approve_rewrite(&s, &branch, &sha)),
        Command::Reconcile { now: _, server } => control_plane(server).and_then(|s| operator::reconcile(&s)),
        Command::Node(NodeCommand::Token { node, server }) => {
            control_plane(server).and_then(|s| operator::node_token(&s, &node))
        }
        Command::Node(NodeCommand::RotateMeshKey { node, timeout, server }) => {
            control_plane(server).and_then(|s| operator::rotate_mesh_key(&s, &node, timeout))
        }
        Command::Nodes { server } => control_plane(server).and_then(|s| operator::nodes(&s)),
        Command::Provenance { environment, server } => {
            control_plane(server).and_then(|s| operator::provenance(&s, &environment))
        }
        Command::Domains { server } => control_plane(server).and_then(|s| operator::domains(&s)),
        Command::Volumes { environment, server } => {
            control_plane(server).and_then(|s| volumes::list(&s, environment.as_deref()))
        }
        Command::Backups {
            environment,
            volume,
            limit,
            server,
        } => control_plane(server).and_then(|s| backups::list(&s, &environment, volume.as_deref(), limit)),
        Command::Rollback {
            environment,
            commit: true,
            repo,
            signing_key,
            ..
        } => rollback_commit::rollback_commit(&repo, &environment, signing_key.as_deref()),
        Command::Rollback {
            environment,
            release,
            timeout,
            server,
            ..
        } => control_plane(server)
            .and_then(|s| rollback::rollback(&s, &environment, release, std::time::Duration::from_secs(timeout))),
        Command::Rollout {
            action:
                RolloutCommand::Promote {
                    environment,
                    timeout,
                    server,
                },
        } => control_plane(server)
            .and_then(|s| rollout::promote(&s, &environment, std::time::Duration::from_secs(timeout))),
        Command::Rollout {
            action:
                RolloutCommand::Abort {
                    environment,
                    timeout,
                    server,
                },
        } => control_plane(server)
            .and_then(|s| rollout::abort(&s, &environment, std::time::Duration::from_secs(timeout))),
        Command::Backup {
            environment,
            volume,
            verify,
            timeout,
            server,
        } => control_plane(server).and_then(|s| {
            backups::run(
                &s,
                &environment,
                &volume,
                verify,
                std::time::Duration::from_secs(timeout),
            )
        }),
        Command::Restore {
            environment,
            volume,
            snapshot,
            timeout,
            server,
        } => control_plane(server).and_then(|s| {
            backups::restore(
                &s,
                &environment,
                &volume,
                snapshot.as_deref(),
                std::time::Duration::from_secs(timeout),
            )
        }),
        Command::Volume(VolumeCommand::Rm {
            environment,
            volume,
            generation,
            server,
        }) => control_plane(server).and_then(|s| volumes::remove(&s, &environment, &volume, generation)),
        Command::Volume(VolumeCommand::Move {
            environment,
            volume,
            to,
            timeout,
            server,
        }) => control_plane(server)
            .and_then(|s| volumes::move_to(&s, &environment, &volume, &to, std::time::Duration::from_secs(timeout))),
        Command::Man { out } => std::fs::create_dir_all(&out)
            .and_then(|()| clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &out))
            .map(|()| 0)
            .map_err(|e| anyhow::anyhow!("cannot write man pages to {}: {e}", out.display())),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "pl", &mut script);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
                .map(|()| 0)
                .map_err(anyhow::Error::from)
        }
    };
    // What was started for this command alone stops again.
    up::sleep_woken();
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader went away (`pl events | head`): what it wanted, it has.
        Err(e) if out::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{} {e:#}", paint.red("error:"));
            ExitCode::from(1)
        }
    }
}

/// The control plane an operator command talks to: `--local DIR` is the one `pl up` runs for
/// that repository; with nothing named, the one `pl up` runs for the repository here, if any.
/// Resolved here so that the operator client knows nothing of `pl up`.
fn control_plane(args: client::ServerArgs) -> anyhow::Result<client::ServerArgs> {
    let format = args.format;
    // A local control plane `pl down` stopped is started for this command, and stopped again
    // after it (`up::wake`): `pl down` names `pl volumes` and `pl volume rm` for what it kept.
    let local = match &args.local {
        Some(dir) => Some(match up::wake(dir)? {
            Some(s) => s,
            None => up::local_server(dir)?,
        }),
        None if !args.names_one() => up::running_local_server().or_else(up::wake_here),
        None => None,
    };
    Ok(match local {
        Some(l) => client::ServerArgs { format, ..l },
        None => args,
    })
}
