#!/usr/bin/env bash
# Runs rpc-server as a service: a launchd agent on macOS, a systemd unit on Linux.
#
#   scripts/service.sh install   [--bin PATH] [-- SERVER ARGS...]   install and start (restarted if it exits)
#   scripts/service.sh uninstall                                    stop and remove
#   scripts/service.sh status                                       what launchd/systemd say
#   scripts/service.sh print     [--bin PATH] [-- SERVER ARGS...]   print the file install would write
#
# SERVER ARGS default to `--host 0.0.0.0 --port 50052`; e.g. bind the Thunderbolt address that RDMA
# uses: scripts/service.sh install -- --host 10.0.0.2 --port 50052 -c
# The binary: --bin, else `rpc-server` on PATH (cargo install --path rpc-server), else this
# checkout's target/release/rpc-server (built if missing). Templates: packaging/.
#   macOS: ~/Library/LaunchAgents/com.ggml-rpc-rs.rpc-server.plist (runs in your login session,
#          which Metal needs), log ~/Library/Logs/rpc-server.log.
#   Linux: /etc/systemd/system/rpc-server.service (root), the binary copied to
#          /usr/local/bin/rpc-server, run as its own unprivileged user; `journalctl -u rpc-server`.
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL=com.ggml-rpc-rs.rpc-server
UNIT=rpc-server.service
# Seconds the service manager waits after SIGTERM before SIGKILL: above rpc-server's default
# --shutdown-grace (10 s) so that a busy worker finishes on its own.
EXIT_TIMEOUT=30
# Prefix of the system paths written on Linux (the tests install into a scratch directory).
ROOT="${SERVICE_ROOT:-}"

die() { echo "service.sh: $*" >&2; exit 1; }
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

cmd="${1:-}"; [ -n "$cmd" ] || usage 1; shift
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || die "--bin needs a path"; bin="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage 0 ;;
    *) die "unknown option $1 (server arguments go after --)" ;;
  esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--host 0.0.0.0 --port 50052)

case "$(uname -s)" in
  Darwin) os=macos ;;
  Linux) os=linux ;;
  *) die "unsupported OS $(uname -s): macOS (launchd) and Linux (systemd) only" ;;
esac

find_bin() {
  if [ -n "$bin" ]; then :
  elif command -v rpc-server >/dev/null 2>&1; then bin="$(command -v rpc-server)"
  else
    [ -x target/release/rpc-server ] || cargo build --release -q -p rpc-server >&2
    bin="$PWD/target/release/rpc-server"
  fi
  case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
  [ -x "$bin" ] || die "no executable at $bin"
}

# sed, not ${s//x/y}: bash 5.2 expands & in a replacement, bash 3.2 (macOS) treats quotes there
# differently.
xml_escape() { printf '%s' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g'; }
# One systemd ExecStart word: double-quoted, with \ and " escaped, % and $ doubled.
unit_word() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/%/%%/g' -e 's/\$/$$/g')"; }

# Copies the template $1 to stdout, replacing each @NAME@ given as NAME=VALUE (one per line;
# values are inserted verbatim: no pattern or replacement syntax, bash 3.2 as on macOS).
render() {
  local tpl="$1" line kv name val; shift
  while IFS= read -r line || [ -n "$line" ]; do
    for kv in "$@"; do
      name="@${kv%%=*}@"; val="${kv#*=}"
      while [[ "$line" == *"$name"* ]]; do line="${line%%"$name"*}$val${line#*"$name"}"; done
    done
    printf '%s\n' "$line"
  done < "$tpl"
}

render_plist() { # $1 = binary
  local pa="" a
  for a in "$1" "${args[@]}"; do pa+=$'\t\t<string>'"$(xml_escape "$a")"$'</string>\n'; done
  pa="${pa%$'\n'}"
  render packaging/rpc-server.plist.in "LABEL=$LABEL" "EXIT_TIMEOUT=$EXIT_TIMEOUT" \
    "LOG=$(xml_escape "$HOME/Library/Logs/rpc-server.log")" "PROGRAM_ARGUMENTS=$pa"
}

render_unit() { # $1 = binary
  local es a
  es="$(unit_word "$1")"
  for a in "${args[@]}"; do es+=" $(unit_word "$a")"; done
  render packaging/rpc-server.service.in "EXIT_TIMEOUT=$EXIT_TIMEOUT" "EXEC_START=$es"
}

plist_path() { echo "$HOME/Library/LaunchAgents/$LABEL.plist"; }
need_root() { [ "$(id -u)" = 0 ] || die "installing a system service needs root: sudo $0 $cmd ..."; }

case "$os/$cmd" in
  macos/print) find_bin; render_plist "$bin" ;;
  linux/print) find_bin; render_unit "${bin}" ;;
  macos/install)
    find_bin
    mkdir -p "$HOME/Library/LaunchAgents" "$HOME/Library/Logs"
    render_plist "$bin" > "$(plist_path)"
    launchctl bootout "gui/$(id -u)/$LABEL" 2>/dev/null || true
    launchctl bootstrap "gui/$(id -u)" "$(plist_path)"
    echo "installed $(plist_path): $bin ${args[*]}"
    echo "log: $HOME/Library/Logs/rpc-server.log; status: $0 status" ;;
  macos/uninstall)
    launchctl bootout "gui/$(id -u)/$LABEL" 2>/dev/null || true
    rm -f "$(plist_path)"
    echo "removed $LABEL" ;;
  macos/status) launchctl print "gui/$(id -u)/$LABEL" ;;
  linux/install)
    need_root; find_bin
    mkdir -p "$ROOT/usr/local/bin" "$ROOT/etc/systemd/system"
    install -m 0755 "$bin" "$ROOT/usr/local/bin/rpc-server"
    render_unit /usr/local/bin/rpc-server > "$ROOT/etc/systemd/system/$UNIT"
    systemctl daemon-reload
    systemctl enable "$UNIT"
    systemctl restart "$UNIT"
    echo "installed /etc/systemd/system/$UNIT: /usr/local/bin/rpc-server ${args[*]}"
    echo "log: journalctl -u rpc-server; status: $0 status" ;;
  linux/uninstall)
    need_root
    systemctl disable --now "$UNIT" 2>/dev/null || true
    rm -f "$ROOT/etc/systemd/system/$UNIT" "$ROOT/usr/local/bin/rpc-server"
    systemctl daemon-reload
    echo "removed $UNIT" ;;
  linux/status) systemctl status --no-pager "$UNIT" ;;
  *) die "unknown command $cmd (install, uninstall, status, print)" ;;
esac
