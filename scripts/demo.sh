#!/usr/bin/env bash
# make demo: build a Read Shard from /usr/share/doc (present on every Debian
# machine), mount it, read objects back by their SHA-256 keys, unmount.
set -euo pipefail

SOURCE=${SOURCE:-/usr/share/doc}
work=$(mktemp -d /tmp/shardfs-demo.XXXXXX)
shard=$work/doc.shard
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    if mountpoint -q "$mnt"; then shardfs umount "$mnt" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "shardfs create $shard $SOURCE"
time shardfs create "$shard" "$SOURCE"

step "shardfs info $shard"
shardfs info "$shard"

step "shardfs mount $shard $mnt"
shardfs mount "$shard" "$mnt"
mount | grep " $mnt " || true

step "a few objects: <key> <size>  (shardfs ls, then ls -l of the mount)"
{ shardfs ls -l "$shard" || true; } | head -5
{ ls -l "$mnt" || true; } | head -6

# One well-known file, found again by the SHA-256 of its content.
sample=$( { ls /usr/share/doc/*/copyright 2>/dev/null || true; } | head -1)
if [ -n "$sample" ]; then
    key=$(sha256sum "$sample" | cut -d' ' -f1)
    step "cat $mnt/$key | head  (the content of $sample)"
    { head -n 8 "$mnt/$key" || true; }
fi

step "sha256sum of mounted files equals their names"
total=0; good=0
while IFS= read -r name; do
    total=$((total + 1))
    sum=$(sha256sum "$mnt/$name" | cut -d' ' -f1)
    [ "$sum" = "$name" ] && good=$((good + 1))
done < <(ls "$mnt" | head -n 500)
echo "$good of $total files checked: sha256sum equals the file name"
[ "$good" = "$total" ]

step "shardfs umount $mnt"
shardfs umount "$mnt"
mountpoint -q "$mnt" && { echo "still mounted"; exit 1; }
echo "unmounted; demo done"
