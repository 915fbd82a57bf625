#!/bin/busybox sh
# /init of the soft-RoCE test VM (packed into the initramfs by run-in-vm.sh).
#
# Mounts the host root read-only over 9p at /host and the per-run share
# read-write at /out, loads the RDMA modules, sets up lo + a veth pair with
# 10.77.0.1/24 on v0 and soft-RoCE rxe0 on v0, then chroots into the host root
# and runs the job script named by rvm.job= on the kernel command line.
# Markers on the console: ===RVM-BOOTED===, ===RVM-BEGIN===,
# ===RVM-EXIT=<rc>===, ===RVM-END===.  Always powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo 1 > /proc/sys/kernel/printk
# The test scripts listen on fixed ports in 50000-53999 (a server's link port is its port + 1000);
# keep the kernel from handing them out as ephemeral source ports of earlier connections (a
# llama-server once failed to bind 50200 in CI for that reason).
echo 50000-53999 > /proc/sys/net/ipv4/ip_local_reserved_ports
echo "===RVM-BOOTED==="

fail() {
    echo "RVM-SETUP-FAILED: $*"
    [ -d /out ] && echo "$*" > /out/.setup_failed 2>/dev/null
    sync
    poweroff -f
    echo o > /proc/sysrq-trigger
    sleep 60
}

job=""
rxe=1
for w in $(cat /proc/cmdline); do
    case "$w" in
        rvm.job=*) job="${w#rvm.job=}" ;;
        rvm.rxe=*) rxe="${w#rvm.rxe=}" ;;
    esac
done

for m in $(cat /lib/modules/rvm-order); do
    insmod "/lib/modules/$m" || echo "RVM: insmod $m failed"
done

mkdir -p /host /out
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host || fail "mount hostroot"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rvmout /out || fail "mount rvmout"
mount --bind /proc /host/proc || fail "bind /proc"
mount --bind /sys /host/sys || fail "bind /sys"
mount --bind /dev /host/dev || fail "bind /dev"
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || fail "tmpfs /tmp"
mount -t tmpfs -o mode=755 tmpfs /host/run || fail "tmpfs /run"
mkdir -p /host/run/rvm /host/dev/shm /host/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm
mkdir -p /out/artifacts
mount --bind /out/artifacts /host/run/rvm || fail "bind artifacts"
hostname rvm

HPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$rxe" = 1 ]; then
    chroot /host /usr/bin/env -i PATH=$HPATH /bin/sh -c '
        set -e
        ip link set lo up
        ip link add v0 type veth peer name v1
        ip addr add 10.77.0.1/24 dev v0
        ip link set v0 up
        ip link set v1 up
        rdma link add rxe0 type rxe netdev v0
        i=0
        while ! grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; do
            i=$((i+1)); [ $i -lt 100 ] || { echo "rxe0 port never became ACTIVE"; exit 1; }
            sleep 0.1
        done
    ' > /out/setup.log 2>&1 || { cat /out/setup.log; fail "soft-RoCE setup"; }
else
    chroot /host /usr/bin/env -i PATH=$HPATH ip link set lo up
fi

[ -n "$job" ] || fail "no rvm.job= on the kernel command line"
echo "===RVM-BEGIN==="
chroot /host /usr/bin/env -i PATH=$HPATH HOME=/root TERM=dumb LANG=C.UTF-8 RVM_OUT=/run/rvm \
    /bin/bash "$job" < /dev/null
rc=$?
echo "$rc" > /out/.exit_code
sync
echo "===RVM-EXIT=$rc==="
echo "===RVM-END==="
umount /host/run/rvm 2>/dev/null
umount /out 2>/dev/null
poweroff -f
echo o > /proc/sysrq-trigger
sleep 60
