#!/usr/bin/env bash
# Runs a script inside a throwaway QEMU (TCG) VM that boots Debian's 6.12
# kernel with soft-RoCE: rxe0 on a veth holding 10.77.0.1/24, the host root
# shared read-only over 9p (so host-built binaries and the host's rdma-core
# run unchanged), tmpfs on /tmp and /run.  See tests/vm/README.md.
#
#   tests/vm/run-in-vm.sh <script> [args...]
#
# The script's output is printed between markers; the exit code of this
# command is the script's (124: script timed out, 125: harness/VM failure).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RVM_CACHE:-$HOME/.cache/ggml-rpc-rs/vm}
ATTEMPTS=${RVM_ATTEMPTS:-3}
BOOT_TIMEOUT=${RVM_BOOT_TIMEOUT:-60}   # seconds until the script starts
TIMEOUT=${RVM_TIMEOUT:-300}            # seconds the script may run
MEM=${RVM_MEM:-2048}
SMP=${RVM_SMP:-2}
RXE=${RVM_RXE:-1}
MODULES="crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe veth 9pnet 9pnet_virtio netfs 9p virtio_net inet_diag tcp_diag"

log() { echo "run-in-vm: $*" >&2; }
die() { log "$*"; exit 125; }

usage() {
    cat >&2 <<'U'
usage: tests/vm/run-in-vm.sh <script> [args...]
  env: RVM_TIMEOUT (300) RVM_BOOT_TIMEOUT (60) RVM_ATTEMPTS (3) RVM_MEM (2048) RVM_SMP (2)
       RVM_PASS_ENV="VAR ..." (exported into the guest; RUST_BACKTRACE RUST_LOG always)
       RVM_ARTIFACTS=<dir> (copy what the script wrote to $RVM_OUT=/run/rvm)
       RVM_RXE=0 (no veth/rxe setup)  RVM_VERBOSE=1 (stream the console to stderr)
       RVM_KEEP=1 (keep the run directory)  RVM_REFRESH=1 (re-pick the newest kernel)
       RVM_KERNEL_PKG=linux-image-6.12.N+deb12-amd64 (pin a kernel)  RVM_CACHE (~/.cache/ggml-rpc-rs/vm)
U
    exit 2
}

[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac

# ------------------------------------------------------------------ tools
need_tools() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v xz >/dev/null || missing+=(xz-utils)
    command -v depmod >/dev/null || missing+=(kmod)
    command -v rdma >/dev/null || missing+=(iproute2)
    command -v ibv_devices >/dev/null || missing+=(ibverbs-utils)
    [ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || ls /usr/lib/*/libibverbs/librxe-*.so >/dev/null 2>&1 \
        || missing+=(ibverbs-providers)
    if [ ${#missing[@]} -gt 0 ]; then
        die "missing host packages: ${missing[*]} (run scripts/deps.sh or apt-get install them)"
    fi
}

# ------------------------------------------------- kernel + initramfs cache
newest_kernel_pkg() {
    apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' 2>/dev/null \
        | awk '{print $1}' | sort -V | tail -1
}

# Copies (decompressed) module files + a load order into $2/lib/modules.
stage_modules() {
    local root=$1 initdir=$2 kver=$3
    local mdir=$root/lib/modules/$kver
    timeout 120 depmod -b "$root" "$kver" || return 1
    declare -A DEP=() SEEN=() BYNAME=()
    local line key name
    while IFS= read -r line; do
        key=${line%%:*}
        DEP[$key]=${line#*:}
        name=${key##*/}; name=${name%%.ko*}; name=${name//-/_}
        BYNAME[$name]=$key
    done < "$mdir/modules.dep"
    ORDER=()
    visit() {
        local p=$1 d
        [ -n "${SEEN[$p]:-}" ] && return 0
        SEEN[$p]=1
        for d in ${DEP[$p]}; do visit "$d"; done
        ORDER+=("$p")
    }
    local m n
    for m in $MODULES; do
        n=${m//-/_}
        if [ -n "${BYNAME[$n]:-}" ]; then
            visit "${BYNAME[$n]}"
        elif grep -qE "/${m}\.ko$|/${n}\.ko$" "$mdir/modules.builtin" 2>/dev/null; then
            :
        else
            log "module $m neither loadable nor built in"; return 1
        fi
    done
    mkdir -p "$initdir/lib/modules"
    : > "$initdir/lib/modules/rvm-order"
    local p base out
    for p in "${ORDER[@]}"; do
        base=${p##*/}; out=${base%%.ko*}.ko
        case "$base" in
            *.ko.xz) xz -dc "$mdir/$p" > "$initdir/lib/modules/$out" ;;
            *.ko.zst) zstd -qdc "$mdir/$p" > "$initdir/lib/modules/$out" ;;
            *.ko.gz) gzip -dc "$mdir/$p" > "$initdir/lib/modules/$out" ;;
            *.ko) cp "$mdir/$p" "$initdir/lib/modules/$out" ;;
        esac
        echo "$out" >> "$initdir/lib/modules/rvm-order"
    done
}

prepare() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock -w 900 9 || die "could not lock $CACHE/.lock"
    local pkg=${RVM_KERNEL_PKG:-}
    if [ -z "$pkg" ] && [ -z "${RVM_REFRESH:-}" ] && [ -s "$CACHE/current" ]; then
        pkg=$(cat "$CACHE/current")
    fi
    if [ -z "$pkg" ]; then
        pkg=$(newest_kernel_pkg)
        if [ -z "$pkg" ]; then
            log "no linux-image-6.12 in the apt lists; running apt-get update"
            timeout 300 apt-get update -qq >&2 || true
            pkg=$(newest_kernel_pkg)
        fi
        [ -n "$pkg" ] || die "no linux-image-6.12.*+deb12-amd64 package found (bookworm / bookworm-security in sources?)"
    fi
    local kver=${pkg#linux-image-}
    local kdir=$CACHE/kernels/$kver
    local init_sum
    init_sum=$(cat "$HERE/init.sh" "$0" | sha256sum | cut -c1-16)
    INITRD=$kdir/initrd-$init_sum.gz
    VMLINUZ=$kdir/root/boot/vmlinuz-$kver
    if [ ! -e "$kdir/.extracted" ]; then
        log "fetching $pkg (first run; cached under $kdir)"
        rm -rf "$kdir"; mkdir -p "$kdir/dl"
        (cd "$kdir/dl" && timeout 600 apt-get download -o APT::Sandbox::User=root "$pkg" >&2) \
            || die "apt-get download $pkg failed"
        timeout 300 dpkg-deb -x "$kdir"/dl/*.deb "$kdir/root" || die "dpkg-deb -x failed"
        rm -rf "$kdir/dl"
        touch "$kdir/.extracted"
    fi
    [ -e "$VMLINUZ" ] || die "no kernel image at $VMLINUZ"
    if [ ! -s "$INITRD" ]; then
        log "building initramfs for $kver"
        local tmp; tmp=$(mktemp -d "$kdir/initramfs.XXXXXX")
        mkdir -p "$tmp"/{bin,dev,proc,sys,lib/modules,host,out}
        cp /bin/busybox "$tmp/bin/busybox"
        cp "$HERE/init.sh" "$tmp/init"; chmod 755 "$tmp/init"
        stage_modules "$kdir/root" "$tmp" "$kver" || { rm -rf "$tmp"; die "module staging failed"; }
        (cd "$tmp" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp" || die "cpio failed"
        mv "$INITRD.tmp" "$INITRD"
        rm -rf "$tmp"
        find "$kdir" -maxdepth 1 -name 'initrd-*.gz' ! -name "${INITRD##*/}" -delete
    fi
    echo "$pkg" > "$CACHE/current"
    KVER=$kver
    flock -u 9
}

# --------------------------------------------------------------- the job
make_job() {
    local script=$1; shift
    [ -f "$script" ] || die "no such script: $script"
    script=$(realpath "$script")
    case "$script" in
        /tmp/*|/run/*|/proc/*|/sys/*|/dev/*)
            # hidden by tmpfs in the guest: ship a copy in the run directory
            cp "$script" "$RUN/job-script"; chmod +x "$RUN/job-script"; script=$RUN/job-script ;;
    esac
    local cwd=$PWD
    case "$cwd" in /tmp|/tmp/*|/run|/run/*) cwd=/ ;; esac
    {
        echo '#!/bin/bash'
        printf 'cd %q 2>/dev/null || cd /\n' "$cwd"
        local v
        for v in RUST_BACKTRACE RUST_LOG ${RVM_PASS_ENV:-}; do
            if [ -n "${!v+x}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
        done
        if [ -x "$script" ]; then printf 'exec %q' "$script"; else printf 'exec /bin/bash %q' "$script"; fi
        local a
        for a in "$@"; do printf ' %q' "$a"; done
        echo
    } > "$RUN/job.sh"
}

# ------------------------------------------------------------------ boot
QPID=""
cleanup() {
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; fi
    if [ -n "${RUN:-}" ] && [ -z "${RVM_KEEP:-}" ]; then rm -rf "$RUN"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One boot.  Sets ATTEMPT_RESULT to: done | boot-failed | timeout | crashed.
boot_once() {
    local con=$RUN/console.log
    rm -rf "$RUN/share"; mkdir -p "$RUN/share/artifacts"
    : > "$con"
    local append="console=ttyS0 quiet loglevel=1 panic=-1 oops=panic rdinit=/init rvm.job=$RUN/job.sh rvm.rxe=$RXE"
    qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$SMP" \
        -nodefaults -no-user-config -display none -no-reboot \
        -serial "file:$con" -monitor none \
        -kernel "$VMLINUZ" -initrd "$INITRD" -append "$append" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$RUN/share,mount_tag=rvmout,security_model=none,multidevs=remap" \
        </dev/null >"$RUN/qemu.log" 2>&1 &
    QPID=$!
    local t0=$SECONDS began="" tail_pid=""
    if [ -n "${RVM_VERBOSE:-}" ]; then tail -n +1 -f "$con" >&2 & tail_pid=$!; fi
    ATTEMPT_RESULT=""
    while kill -0 "$QPID" 2>/dev/null; do
        if [ -z "$began" ]; then
            if grep -q '===RVM-BEGIN===' "$con"; then
                began=$SECONDS; BOOT_SECS=$((SECONDS - t0))
            elif grep -qE 'Kernel panic|RVM-SETUP-FAILED' "$con"; then
                sleep 1; break
            elif [ $((SECONDS - t0)) -ge "$BOOT_TIMEOUT" ]; then
                ATTEMPT_RESULT=boot-timeout; break
            fi
        elif [ $((SECONDS - began)) -ge "$TIMEOUT" ]; then
            ATTEMPT_RESULT=timeout; break
        fi
        sleep 0.25
    done
    if kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; fi
    wait "$QPID" 2>/dev/null || true
    QPID=""
    [ -n "$tail_pid" ] && { kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true; }
    if [ -z "$began" ] && grep -q '===RVM-BEGIN===' "$con"; then began=$SECONDS; BOOT_SECS=$((SECONDS - t0)); fi
    if [ -n "$ATTEMPT_RESULT" ]; then
        [ "$ATTEMPT_RESULT" = boot-timeout ] && ATTEMPT_RESULT=boot-failed
    elif [ -z "$began" ]; then
        ATTEMPT_RESULT=boot-failed
    elif grep -q '===RVM-END===' "$con" || [ -s "$RUN/share/.exit_code" ]; then
        ATTEMPT_RESULT=done
    else
        ATTEMPT_RESULT=crashed
    fi
    SCRIPT_SECS=$(( began ? SECONDS - began : 0 ))
}

print_section() {
    # Script output: lines between the BEGIN and EXIT markers, CRs stripped.
    tr -d '\r' < "$RUN/console.log" | awk '
        /===RVM-BEGIN===/ { on = 1; next }
        /===RVM-EXIT=/    { on = 0 }
        on { print }'
}

# ------------------------------------------------------------------ main
need_tools
prepare
mkdir -p "$CACHE/runs"
RUN=$(mktemp -d "$CACHE/runs/run.XXXXXX")
make_job "$@"

T0=$SECONDS
rc=125
for attempt in $(seq 1 "$ATTEMPTS"); do
    BOOT_SECS=0 SCRIPT_SECS=0
    boot_once
    case "$ATTEMPT_RESULT" in
        done)
            echo "===== run-in-vm: output of $* ====="
            print_section
            echo "===== run-in-vm: end of output ====="
            rc=$(tr -dc '0-9' < "$RUN/share/.exit_code" 2>/dev/null || true)
            if [ -z "$rc" ]; then
                rc=$(tr -d '\r' < "$RUN/console.log" | sed -n 's/^===RVM-EXIT=\([0-9]*\)===$/\1/p' | tail -1)
            fi
            rc=${rc:-125}
            break ;;
        boot-failed)
            if grep -q 'RVM-SETUP-FAILED' "$RUN/console.log"; then
                { tr -d '\r' < "$RUN/console.log" | tail -30 >&2; } || true
                die "VM setup failed (not a flaky boot; not retrying)"
            fi
            log "attempt $attempt/$ATTEMPTS: the VM never reached the script (flaky TCG boot?); console tail:"
            { tr -d '\r' < "$RUN/console.log" | grep -v '^$' | tail -8 | sed 's/^/    /' >&2; } || true
            [ -s "$RUN/qemu.log" ] && sed 's/^/    qemu: /' "$RUN/qemu.log" >&2
            continue ;;
        timeout)
            echo "===== run-in-vm: output of $* (TIMED OUT after ${TIMEOUT}s) ====="
            print_section
            echo "===== run-in-vm: end of output ====="
            rc=124
            break ;;
        crashed)
            echo "===== run-in-vm: output of $* (VM DIED during the script) ====="
            print_section
            echo "===== run-in-vm: end of output ====="
            tr -d '\r' < "$RUN/console.log" | grep -E 'panic|Oops|BUG' | head -5 >&2 || true
            rc=125
            break ;;
    esac
done
if [ "$ATTEMPT_RESULT" = boot-failed ]; then
    log "giving up after $ATTEMPTS boot attempts"
fi
if [ -n "${RVM_ARTIFACTS:-}" ] && [ -d "$RUN/share/artifacts" ]; then
    mkdir -p "$RVM_ARTIFACTS" && cp -a "$RUN/share/artifacts/." "$RVM_ARTIFACTS/"
fi
log "kernel $KVER, attempt(s) $attempt, boot ${BOOT_SECS}s, script ${SCRIPT_SECS}s, total $((SECONDS - T0))s, exit $rc"
exit "$rc"
