#!/usr/bin/env bash
# Runs rpc-server as a service: a launchd daemon (or agent) on macOS, a systemd unit on Linux.
#
#   sudo scripts/service.sh install [--user NAME] [--bin PATH] [-- SERVER ARGS...]   install and start
#   sudo scripts/service.sh restart      stop and start again (after a rebuild)
#   sudo scripts/service.sh uninstall    stop and remove
#   scripts/service.sh status            what launchd/systemd say
#   scripts/service.sh print [--user NAME] [--bin PATH] [-- SERVER ARGS...]   the file install would write
#   --agent (macOS, no sudo): the same commands for a per-user agent in your login session instead.
#
# SERVER ARGS default to `--host 0.0.0.0 --port 50052`; e.g. bind the Thunderbolt address that RDMA
# uses: sudo scripts/service.sh install -- --host 10.0.0.2 --port 50052 -c
# The binary: --bin, else `rpc-server` on PATH (cargo install --path rpc-server), else this
# checkout's target/release/rpc-server (built if missing). Templates: packaging/.
#   macOS: /Library/LaunchDaemons/com.ggml-rpc-rs.rpc-server.plist, loaded into the system domain:
#          runs from boot with nobody logged in, as the unprivileged account NAME (default: the
#          account that ran sudo; never root), HOME its home, log ~NAME/Library/Logs/rpc-server.log.
#          Restart: sudo launchctl kickstart -k system/com.ggml-rpc-rs.rpc-server
#          --agent: ~/Library/LaunchAgents/com.ggml-rpc-rs.rpc-server.plist (runs while you are
#          logged in), same log.
#   Linux: /etc/systemd/system/rpc-server.service (root), the binary copied to
#          /usr/local/bin/rpc-server, run as its own unprivileged user; `journalctl -u rpc-server`.
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL=com.ggml-rpc-rs.rpc-server
UNIT=rpc-server.service
# Seconds the service manager waits after SIGTERM before SIGKILL: above rpc-server's default
# --shutdown-grace (10 s) so that a busy worker finishes on its own.
EXIT_TIMEOUT=30
# Prefix of the system paths written (/etc/systemd, /usr/local/bin, /Library/LaunchDaemons; the
# tests install into a scratch directory).
ROOT="${SERVICE_ROOT:-}"

die() { echo "service.sh: $*" >&2; exit 1; }
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

cmd="${1:-}"; [ -n "$cmd" ] || usage 1; shift
bin=""; user=""; agent=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || die "--bin needs a path"; bin="$2"; shift 2 ;;
    --user) [ $# -ge 2 ] || die "--user needs an account name"; user="$2"; shift 2 ;;
    --agent) agent=1; shift ;;
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
[ "$os" = macos ] || [ "$agent" = 0 ] || die "--agent is for macOS (launchd); Linux has the systemd unit"

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

program_arguments() { # $1 = binary: the plist's <string> lines
  local pa="" a
  for a in "$1" "${args[@]}"; do pa+=$'\t\t<string>'"$(xml_escape "$a")"$'</string>\n'; done
  printf '%s' "${pa%$'\n'}"
}

render_agent() { # $1 = binary
  render packaging/rpc-server.plist.in "LABEL=$LABEL" "EXIT_TIMEOUT=$EXIT_TIMEOUT" \
    "LOG=$(xml_escape "$HOME/Library/Logs/rpc-server.log")" "PROGRAM_ARGUMENTS=$(program_arguments "$1")"
}

render_daemon() { # $1 = binary; user and home set (resolve_user)
  render packaging/rpc-server.daemon.plist.in "LABEL=$LABEL" "EXIT_TIMEOUT=$EXIT_TIMEOUT" \
    "USER=$(xml_escape "$user")" "HOME=$(xml_escape "$home")" \
    "LOG=$(xml_escape "$home/Library/Logs/rpc-server.log")" "PROGRAM_ARGUMENTS=$(program_arguments "$1")"
}

render_unit() { # $1 = binary
  local es a
  es="$(unit_word "$1")"
  for a in "${args[@]}"; do es+=" $(unit_word "$a")"; done
  render packaging/rpc-server.service.in "EXIT_TIMEOUT=$EXIT_TIMEOUT" "EXEC_START=$es"
}

agent_plist() { echo "$HOME/Library/LaunchAgents/$LABEL.plist"; }
daemon_plist() { echo "$ROOT/Library/LaunchDaemons/$LABEL.plist"; }
is_root() { [ "$(id -u)" = 0 ]; }
need_root() { is_root || die "$1 needs root: sudo $0 $cmd ...${2:+ ($2)}"; }

# The daemon's account: --user, else the account that ran sudo, else (print only) this one. Sets
# user, uid and home; refuses root and accounts without a home directory.
resolve_user() {
  if [ -z "$user" ]; then
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then user="$SUDO_USER"
    elif ! is_root; then user="$(id -un)"
    else die "name the unprivileged account the daemon runs as: $0 $cmd --user NAME (root is refused)"
    fi
  fi
  case "$user" in
    root) die "the daemon does not run as root: --user NAME, an unprivileged account" ;;
    ''|-*|*[!A-Za-z0-9_.-]*) die "not an account name: '$user'" ;;
  esac
  uid="$(id -u "$user" 2>/dev/null)" || die "no account '$user' (create one, or name another with --user)"
  [ "$uid" != 0 ] || die "the account '$user' has uid 0: the daemon runs unprivileged"
  home="$(dscl . -read "/Users/$user" NFSHomeDirectory 2>/dev/null | sed -n 's/^NFSHomeDirectory: //p')"
  [ -n "$home" ] || die "no home directory recorded for '$user' (dscl . -read /Users/$user NFSHomeDirectory)"
  [ -d "$ROOT$home" ] || die "the home directory $home of '$user' does not exist yet: sudo createhomedir -c -u $user"
}

# Warns when the binary lies where launchd jobs need Full Disk Access (TCC) to read it.
check_tcc() {
  case "$1" in
    */Desktop/*|*/Documents/*|*/Downloads/*)
      echo "service.sh: warning: $1 is under Desktop, Documents or Downloads, which macOS keeps from" \
        "background services without Full Disk Access: move the checkout (e.g. to ~/src) or install" \
        "the binary elsewhere (cargo install --path rpc-server)" >&2 ;;
  esac
}

# The account's Library/Logs and log file, created owned by the account (root creates them here).
prepare_log() {
  local d
  for d in "$home/Library" "$home/Library/Logs"; do
    if [ ! -d "$ROOT$d" ]; then mkdir "$ROOT$d"; chown "$user" "$ROOT$d"; fi
  done
  [ -e "$ROOT$home/Library/Logs/rpc-server.log" ] || : > "$ROOT$home/Library/Logs/rpc-server.log"
  chown "$user" "$ROOT$home/Library/Logs/rpc-server.log"
}

if [ "$os/$agent" = macos/0 ]; then
  case "$cmd" in
    print) resolve_user; find_bin; render_daemon "$bin" ;;
    install)
      need_root "installing the daemon" "or --agent, without sudo, for an agent in your login session"
      resolve_user; find_bin; check_tcc "$bin"
      prepare_log
      mkdir -p "$ROOT/Library/LaunchDaemons"
      render_daemon "$bin" > "$(daemon_plist).tmp"
      # launchd loads a daemon only from a file owned by root, not writable by others.
      chown root:wheel "$(daemon_plist).tmp"; chmod 644 "$(daemon_plist).tmp"
      mv "$(daemon_plist).tmp" "$(daemon_plist)"
      # The same account's agent would compete for the port: replaced by the daemon.
      old_agent="$ROOT$home/Library/LaunchAgents/$LABEL.plist"
      if [ -e "$old_agent" ]; then
        launchctl bootout "gui/$uid/$LABEL" 2>/dev/null || true
        rm -f "$old_agent"
        echo "removed $user's agent $home/Library/LaunchAgents/$LABEL.plist (the daemon replaces it)"
      fi
      launchctl bootout "system/$LABEL" 2>/dev/null || true
      launchctl bootstrap system "$(daemon_plist)"
      echo "installed $(daemon_plist) (user $user): $bin ${args[*]}"
      echo "log: $home/Library/Logs/rpc-server.log; status: $0 status; restart: sudo launchctl kickstart -k system/$LABEL" ;;
    restart) need_root "restarting the daemon"; launchctl kickstart -k "system/$LABEL" ;;
    uninstall)
      need_root "removing the daemon"
      launchctl bootout "system/$LABEL" 2>/dev/null || true
      rm -f "$(daemon_plist)"
      echo "removed $LABEL (the log stays)" ;;
    status) launchctl print "system/$LABEL" ;;
    *) die "unknown command $cmd (install, uninstall, restart, status, print)" ;;
  esac
  exit 0
fi

case "$os/$cmd" in
  macos/print) find_bin; render_agent "$bin" ;;
  linux/print) find_bin; render_unit "${bin}" ;;
  macos/install)
    is_root && die "the agent runs in your own login session: run without sudo (the daemon: sudo $0 install)"
    find_bin; check_tcc "$bin"
    mkdir -p "$HOME/Library/LaunchAgents" "$HOME/Library/Logs"
    render_agent "$bin" > "$(agent_plist)"
    launchctl bootout "gui/$(id -u)/$LABEL" 2>/dev/null || true
    launchctl bootstrap "gui/$(id -u)" "$(agent_plist)"
    echo "installed $(agent_plist): $bin ${args[*]}"
    echo "log: $HOME/Library/Logs/rpc-server.log; status: $0 status --agent" ;;
  macos/restart) launchctl kickstart -k "gui/$(id -u)/$LABEL" ;;
  macos/uninstall)
    launchctl bootout "gui/$(id -u)/$LABEL" 2>/dev/null || true
    rm -f "$(agent_plist)"
    echo "removed $LABEL" ;;
  macos/status) launchctl print "gui/$(id -u)/$LABEL" ;;
  linux/install)
    need_root "installing a system service"; find_bin
    mkdir -p "$ROOT/usr/local/bin" "$ROOT/etc/systemd/system"
    install -m 0755 "$bin" "$ROOT/usr/local/bin/rpc-server"
    render_unit /usr/local/bin/rpc-server > "$ROOT/etc/systemd/system/$UNIT"
    systemctl daemon-reload
    systemctl enable "$UNIT"
    systemctl restart "$UNIT"
    echo "installed /etc/systemd/system/$UNIT: /usr/local/bin/rpc-server ${args[*]}"
    echo "log: journalctl -u rpc-server; status: $0 status" ;;
  linux/restart) need_root "restarting a system service"; systemctl restart "$UNIT" ;;
  linux/uninstall)
    need_root "removing a system service"
    systemctl disable --now "$UNIT" 2>/dev/null || true
    rm -f "$ROOT/etc/systemd/system/$UNIT" "$ROOT/usr/local/bin/rpc-server"
    systemctl daemon-reload
    echo "removed $UNIT" ;;
  linux/status) systemctl status --no-pager "$UNIT" ;;
  *) die "unknown command $cmd (install, uninstall, restart, status, print)" ;;
esac
