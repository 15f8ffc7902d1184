//! `pl secret` against the real `age` CLI: values Pushleft encrypts decrypt with `age`, values
//! `age` encrypts decrypt with Pushleft; plans never show plaintext; every refusal has its code
//! and leaves the files as they were.

mod common;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct AgeKey {
    file: PathBuf,
    recipient: String,
}

fn age_keygen(dir: &Path, name: &str) -> AgeKey {
    let file = dir.join(format!("{name}.key"));
    let o = Command::new("age-keygen")
        .arg("-o")
        .arg(&file)
        .output()
        .expect("age-keygen runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let y = Command::new("age-keygen")
        .arg("-y")
        .arg(&file)
        .output()
        .expect("age-keygen -y");
    AgeKey {
        file,
        recipient: String::from_utf8_lossy(&y.stdout).trim().to_owned(),
    }
}

fn age_encrypt(value: &[u8], recipients: &[&AgeKey]) -> String {
    let mut c = Command::new("age");
    c.arg("-a");
    for r in recipients {
        c.args(["-r", &r.recipient]);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("age runs");
    child.stdin.take().expect("stdin").write_all(value).expect("write");
    let o = child.wait_with_output().expect("age finishes");
    assert!(o.status.success());
    String::from_utf8(o.stdout).expect("armour")
}

fn age_decrypt(armored: &str, key: &AgeKey) -> Option<Vec<u8>> {
    let mut child = Command::new("age")
        .arg("-d")
        .arg("-i")
        .arg(&key.file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("age runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(armored.as_bytes())
        .expect("write");
    let o = child.wait_with_output().expect("age finishes");
    o.status.success().then_some(o.stdout)
}

/// The armoured ciphertext of `key` in Secret `name`, read back with Pushleft's parser.
fn ciphertext_of(repo: &Path, file: &str, key: &str) -> String {
    let text = std::fs::read(repo.join(file)).expect("read");
    let parsed = state_schema::parse::parse_file(file, &text);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    parsed
        .objects
        .iter()
        .find_map(|l| match &l.object.spec {
            state_schema::model::Spec::Secret(s) => s.data.get(key).map(|c| c.armored().to_owned()),
            _ => None,
        })
        .expect("the key is there")
}

fn secret_cmd(repo: &Path, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut c = pl();
    c.arg("secret")
        .args(args)
        .arg("-C")
        .arg(repo)
        .env_remove("PL_AGE_IDENTITY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("pl runs");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(bytes) = stdin {
        // `pl` may refuse bad input and exit before it reads: a broken pipe then is expected.
        match input.write_all(bytes) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write: {e}"),
            _ => {}
        }
    }
    drop(input);
    child.wait_with_output().expect("pl finishes")
}

const SECRET_FILE: &str = "secrets/app.yaml";

/// A quickstart tree whose Repository names the control recipient, with one Secret `app`.
fn setup(tmp: &Path) -> (PathBuf, AgeKey, AgeKey) {
    let keys = tmp.join("keys");
    std::fs::create_dir_all(&keys).expect("mkdir");
    let control = age_keygen(&keys, "control");
    let dev = age_keygen(&keys, "dev");
    let repo = tmp.join("state");
    init_repo(&repo);
    copy_tree(&workspace().join("examples/quickstart"), &repo);
    let root = std::fs::read_to_string(repo.join("pushleft.yaml")).expect("read");
    std::fs::write(
        repo.join("pushleft.yaml"),
        format!("{root}  controlRecipient: {}\n", control.recipient),
    )
    .expect("write");
    std::fs::create_dir_all(repo.join("secrets")).expect("mkdir");
    let first = age_encrypt(b"initial", &[&control, &dev]);
    let indented: String = first.lines().map(|l| format!("      {l}\n")).collect();
    std::fs::write(
        repo.join(SECRET_FILE),
        format!("# kept: this comment is outside the Secret document\napiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: app\nspec:\n  recipients:\n    - {}\n    - {}\n  data:\n    TOKEN: |\n{indented}", control.recipient, dev.recipient),
    )
    .expect("write");
    assert_eq!(
        run(pl().arg("validate").arg(&repo)).status.code(),
        Some(0),
        "the fixture validates"
    );
    commit_all(&repo, "state with a secret");
    (repo, control, dev)
}

#[test]
fn values_cross_between_pl_and_the_age_cli() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (repo, control, dev) = setup(tmp.path());
    // age CLI → pl: the fixture's value was made by `age`.
    let o = secret_cmd(
        &repo,
        &["show", "app", "TOKEN", "--identity", dev.file.to_str().expect("utf-8")],
        None,
    );
    assert_eq!(
        (o.status.code(), o.stdout.as_slice()),
        (Some(0), b"initial".as_slice()),
        "{}",
        stderr(&o)
    );
    // pl → age CLI, with binary-safe bytes read from stdin.
    let value = b"p@ss\nw0rd\x00\xff";
    let o = secret_cmd(&repo, &["set", "app", "DB_PASSWORD"], Some(value));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ct = ciphertext_of(&repo, SECRET_FILE, "DB_PASSWORD");
    assert_eq!(
        age_decrypt(&ct, &control).as_deref(),
        Some(value.as_slice()),
        "the control host's key decrypts"
    );
    assert_eq!(
        age_decrypt(&ct, &dev).as_deref(),
        Some(value.as_slice()),
        "every recipient's key decrypts"
    );
    assert!(
        std::fs::read_to_string(repo.join(SECRET_FILE))
            .expect("read")
            .starts_with("# kept"),
        "the rest of the file is kept"
    );
    assert_eq!(run(pl().arg("validate").arg(&repo)).status.code(), Some(0));
    // PL_AGE_IDENTITY names the identity when --identity does not.
    let o = pl()
        .args(["secret", "show", "app", "DB_PASSWORD", "-C"])
        .arg(&repo)
        .env("PL_AGE_IDENTITY", &control.file)
        .output()
        .expect("runs");
    assert_eq!(o.stdout.as_slice(), value.as_slice());

    // Plans never show a value, not even the old one.
    let o = run(pl().args(["plan", "--base", "HEAD", "--format", "json"]).arg(&repo));
    let text = stdout(&o);
    assert!(!text.contains("p@ss") && !text.contains("initial"), "{text}");
    assert!(text.contains("(encrypted sha256:"), "{text}");
    let o = run(pl().args(["plan", "--base", "HEAD"]).arg(&repo));
    assert!(!stdout(&o).contains("p@ss") && stdout(&o).contains(&control.recipient));
}

#[test]
fn recipients_are_rekeyed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (repo, control, dev) = setup(tmp.path());
    let ops = age_keygen(&tmp.path().join("keys"), "ops");
    let id = control.file.to_str().expect("utf-8").to_owned();
    let o = secret_cmd(
        &repo,
        &[
            "recipients",
            "app",
            "--add",
            &ops.recipient,
            "--remove",
            &dev.recipient,
            "--identity",
            &id,
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ct = ciphertext_of(&repo, SECRET_FILE, "TOKEN");
    assert_eq!(
        age_decrypt(&ct, &ops).as_deref(),
        Some(b"initial".as_slice()),
        "the added key decrypts"
    );
    assert_eq!(age_decrypt(&ct, &dev), None, "the removed key does not");
    let o = secret_cmd(
        &repo,
        &["show", "app", "TOKEN", "--identity", dev.file.to_str().expect("utf-8")],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("[no-matching-identity]"), "{}", stderr(&o));
    // An ssh-ed25519 recipient: age's CLI and pl both decrypt with the SSH private key.
    let ssh_key = tmp.path().join("keys/id_ed25519");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&ssh_key)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success());
    let ssh_pub = std::fs::read_to_string(ssh_key.with_extension("pub"))
        .expect("pub")
        .trim()
        .to_owned();
    let o = secret_cmd(
        &repo,
        &["recipients", "app", "--add", &ssh_pub, "--identity", &id],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ssh_id = AgeKey {
        file: ssh_key.clone(),
        recipient: ssh_pub,
    };
    assert_eq!(
        age_decrypt(&ciphertext_of(&repo, SECRET_FILE, "TOKEN"), &ssh_id).as_deref(),
        Some(b"initial".as_slice())
    );
    let o = secret_cmd(
        &repo,
        &["show", "app", "TOKEN", "--identity", ssh_key.to_str().expect("utf-8")],
        None,
    );
    assert_eq!(
        (o.status.code(), o.stdout.as_slice()),
        (Some(0), b"initial".as_slice()),
        "{}",
        stderr(&o)
    );
    // Removing the control host's key is refused, and nothing changes.
    let before = std::fs::read(repo.join(SECRET_FILE)).expect("read");
    let o = secret_cmd(
        &repo,
        &["recipients", "app", "--remove", &control.recipient, "--identity", &id],
        None,
    );
    assert!(stderr(&o).contains("[secret-control-key-missing]"), "{}", stderr(&o));
    assert_eq!(std::fs::read(repo.join(SECRET_FILE)).expect("read"), before);
}

#[test]
fn bad_input_is_refused_with_codes_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (repo, control, _dev) = setup(tmp.path());
    let id = control.file.to_str().expect("utf-8").to_owned();
    let before = std::fs::read(repo.join(SECRET_FILE)).expect("read");
    let unchanged = |what: &str| {
        assert_eq!(
            std::fs::read(repo.join(SECRET_FILE)).expect("read"),
            before,
            "{what} wrote nothing"
        )
    };
    let expect = |o: std::process::Output, code: &str| {
        assert_eq!(o.status.code(), Some(1), "{code}");
        assert!(stderr(&o).contains(&format!("[{code}]")), "want {code}: {}", stderr(&o));
        assert!(!stderr(&o).contains("initial"), "no value in errors");
    };
    expect(
        secret_cmd(&repo, &["set", "app", "BIG"], Some(&vec![b'x'; 64 * 1024 + 1])),
        "value-too-large",
    );
    unchanged("a value over 64 KiB");
    expect(
        secret_cmd(&repo, &["set", "app", "bad-key"], Some(b"v")),
        "invalid-name",
    );
    expect(
        secret_cmd(
            &repo,
            &["recipients", "app", "--add", "not-a-key", "--identity", &id],
            None,
        ),
        "invalid-recipient",
    );
    unchanged("a recipient that is not a key");
    let loose = tmp.path().join("keys/loose.key");
    std::fs::copy(&control.file, &loose).expect("copy");
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    expect(
        secret_cmd(
            &repo,
            &["show", "app", "TOKEN", "--identity", loose.to_str().expect("utf-8")],
            None,
        ),
        "identity-permissions",
    );
    let stranger = age_keygen(&tmp.path().join("keys"), "stranger");
    expect(
        secret_cmd(
            &repo,
            &[
                "show",
                "app",
                "TOKEN",
                "--identity",
                stranger.file.to_str().expect("utf-8"),
            ],
            None,
        ),
        "no-matching-identity",
    );
    expect(secret_cmd(&repo, &["show", "app", "TOKEN"], None), "no-identity");

    // Ciphertext that is armour-shaped but not age, and age ciphertext with a line cut out.
    let good = ciphertext_of(&repo, SECRET_FILE, "TOKEN");
    let text = String::from_utf8(before.clone()).expect("utf-8");
    let replace_token = |armored: &str| {
        let indented: String = armored.lines().map(|l| format!("      {l}\n")).collect();
        let start = text.find("    TOKEN: |\n").expect("token") + "    TOKEN: |\n".len();
        std::fs::write(repo.join(SECRET_FILE), format!("{}{indented}", &text[..start])).expect("write");
    };
    replace_token("-----BEGIN AGE ENCRYPTED FILE-----\naGVsbG8gd29ybGQ=\n-----END AGE ENCRYPTED FILE-----");
    expect(
        secret_cmd(&repo, &["show", "app", "TOKEN", "--identity", &id], None),
        "malformed-armor",
    );
    let mut lines: Vec<&str> = good.lines().collect();
    lines.remove(lines.len() - 2);
    replace_token(&lines.join("\n"));
    expect(
        secret_cmd(&repo, &["show", "app", "TOKEN", "--identity", &id], None),
        "truncated-ciphertext",
    );
}

/// `pl secret edit app` in `repo` with `editor` as `$EDITOR`.
fn edit_command(repo: &Path, identity: &Path, editor: &Path) -> std::process::Command {
    let mut c = pl();
    c.args(["secret", "edit", "app", "--identity"])
        .arg(identity)
        .arg("-C")
        .arg(repo)
        .env("EDITOR", editor)
        .env_remove("VISUAL");
    c
}

#[test]
fn edit_uses_a_private_file_and_removes_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (repo, control, _) = setup(tmp.path());
    let record = tmp.path().join("editor-saw");
    let editor = tmp.path().join("editor.sh");
    std::fs::write(&editor, format!("#!/bin/sh\nstat -c '%a %n' \"$1\" > {r}\nstat -c '%a' \"$(dirname \"$1\")\" >> {r}\nsed -i 's/^TOKEN: .*/TOKEN: changed/' \"$1\"\necho 'NEW_KEY: \"42\"' >> \"$1\"\n", r = record.display())).expect("write");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let o = edit_command(&repo, &control.file, &editor).output().expect("runs");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let saw = std::fs::read_to_string(&record).expect("the editor ran");
    let mut lines = saw.lines();
    let (mode, path) = lines.next().expect("file line").split_once(' ').expect("mode and path");
    assert_eq!(mode, "600");
    assert_eq!(lines.next(), Some("700"), "the folder is private");
    assert!(!Path::new(path).exists(), "the decrypted file is gone");
    assert_eq!(
        age_decrypt(&ciphertext_of(&repo, SECRET_FILE, "TOKEN"), &control).as_deref(),
        Some(b"changed".as_slice())
    );
    assert_eq!(
        age_decrypt(&ciphertext_of(&repo, SECRET_FILE, "NEW_KEY"), &control).as_deref(),
        Some(b"42".as_slice())
    );
    // A failing editor changes nothing and still leaves no file behind.
    let before = std::fs::read(repo.join(SECRET_FILE)).expect("read");
    std::fs::write(
        &editor,
        format!("#!/bin/sh\necho \"$1\" > {r}\nexit 3\n", r = record.display()),
    )
    .expect("write");
    let o = edit_command(&repo, &control.file, &editor).output().expect("runs");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(std::fs::read(repo.join(SECRET_FILE)).expect("read"), before);
    let path = std::fs::read_to_string(&record).expect("recorded");
    assert!(!Path::new(path.trim()).exists());

    // A closed terminal, a kill or Ctrl-\ while the editor is open: the plaintext is removed
    // all the same, and nothing changes. The editor here records its file and waits.
    std::fs::write(
        &editor,
        format!(
            "#!/bin/sh
echo \"$1\" > {r}.tmp
mv {r}.tmp {r}
sleep 30
",
            r = record.display()
        ),
    )
    .expect("write");
    for signal in ["-HUP", "-TERM", "-QUIT"] {
        let _ = std::fs::remove_file(&record);
        let mut child = edit_command(&repo, &control.file, &editor)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        let path = (0..200)
            .find_map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(25));
                std::fs::read_to_string(&record).ok()
            })
            .expect("the editor started within 5 s");
        let path = Path::new(path.trim()).to_owned();
        assert!(path.exists(), "{signal}: the plaintext exists while the editor is open");
        let sent = std::process::Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(sent.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "{signal}: pl did not end");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(1), "{signal}");
        assert!(!path.exists(), "{signal}: the plaintext was removed");
        assert!(!path.parent().expect("folder").exists(), "{signal}: and its folder");
        assert_eq!(std::fs::read(repo.join(SECRET_FILE)).expect("read"), before);
    }
}
