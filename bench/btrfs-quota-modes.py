#!/usr/bin/env python3
"""What btrfs quota accounting costs a sandbox made from a template (docs/decisions/022).

On a fresh loop-mounted btrfs image per mode (quotas off, full qgroups as Capsule runs them
today, simple quotas), a template-sized tree in a subvolume, then N times: snapshot it, write
4 KiB into the snapshot and fsync (a sandbox's first write waits for the commit), and with
--delete keep only the last 4 snapshots (deleted roots being dropped meanwhile). Prints p50, p90
and max per mode, and the quota groups of the last snapshots (what each mode charges them).

Simple quotas (kernel 6.7+) are enabled by the BTRFS_IOC_QUOTA_CTL ioctl: Debian 12's
btrfs-progs 6.2 has no `quota enable --simple`. Python for the ioctl; run as root:

    python3 bench/btrfs-quota-modes.py [--n 60] [--delete]

Bounded: N snapshots per mode, a 4 GiB sparse image under a temporary directory it removes.
"""
import argparse
import fcntl
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import time

BTRFS_IOC_QUOTA_CTL = 0xC0109428  # _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args), 16 bytes
BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA = 4
TREES = ['/usr/lib/python3', '/usr/share/perl', '/usr/share/locale']


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(work: str, mode: str, n: int, delete: bool) -> None:
    img, mnt = os.path.join(work, f'{mode}.img'), os.path.join(work, f'{mode}.mnt')
    with open(img, 'wb') as f:
        f.truncate(4 << 30)
    sh('mkfs.btrfs', '-q', img)
    os.makedirs(mnt)
    sh('mount', '-o', 'loop', img, mnt)
    try:
        if mode == 'full':
            sh('btrfs', 'quota', 'enable', mnt)
        if mode == 'simple':
            fd = os.open(mnt, os.O_RDONLY)
            try:
                fcntl.ioctl(fd, BTRFS_IOC_QUOTA_CTL, struct.pack('QQ', BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA, 0))
            finally:
                os.close(fd)
        sh('btrfs', 'subvolume', 'create', f'{mnt}/tpl')
        trees = [t for t in TREES if os.path.isdir(t)]
        sh('cp', '-a', *trees, f'{mnt}/tpl/')
        sh('btrfs', 'filesystem', 'sync', mnt)
        size = subprocess.run(['du', '-sh', f'{mnt}/tpl'], capture_output=True, text=True).stdout.split()[0]
        times, live = [], []
        for i in range(n):
            started = time.perf_counter()
            sh('btrfs', 'subvolume', 'snapshot', f'{mnt}/tpl', f'{mnt}/s{i}')
            with open(f'{mnt}/s{i}/first-write', 'w') as f:
                f.write('x' * 4096)
                f.flush()
                os.fsync(f.fileno())
            times.append((time.perf_counter() - started) * 1000)
            live.append(i)
            if delete and len(live) > 4:
                sh('btrfs', 'subvolume', 'delete', f'{mnt}/s{live.pop(0)}')
        steady = sorted(times[n // 6:])
        print(f'{mode:>6}: template {size}, snapshot + first write + fsync: p50 {statistics.median(steady):.1f} ms, '
              f'p90 {steady[int(0.9 * (len(steady) - 1))]:.1f} ms, max {steady[-1]:.1f} ms ({len(steady)} of {n})')
        if mode != 'off':
            shown = subprocess.run(['btrfs', 'qgroup', 'show', '-re', mnt], capture_output=True, text=True).stdout.strip().split('\n')
            print('        last quota groups (referenced, exclusive):', '; '.join(' '.join(line.split()[:3]) for line in shown[-2:]))
    finally:
        subprocess.run(['umount', mnt], check=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--n', type=int, default=60, choices=range(12, 1001), metavar='12..1000')
    parser.add_argument('--delete', action='store_true')
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix='capsule-quota-modes-')
    try:
        for mode in ('off', 'full', 'simple'):
            measure(work, mode, args.n, args.delete)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
