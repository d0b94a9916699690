#!/usr/bin/env bash
# make demo: build a Read Shard from /usr/share/doc (present on every Debian
# machine), mount it, read objects back by their SHA-256 keys, unmount; then
# several shards as one fan-out tree with --shard-dir, and a new shard
# picked up live.
set -euo pipefail

SOURCE=${SOURCE:-/usr/share/doc}
work=$(mktemp -d /tmp/shardfs-demo.XXXXXX)
shard=$work/doc.shard
mnt=$work/mnt
many=$work/many
mkdir -p "$mnt" "$many" "$work/shards"
cleanup() {
    if mountpoint -q "$mnt"; then shardfs umount "$mnt" || true; fi
    if mountpoint -q "$many"; then shardfs umount "$many" || true; fi
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
echo "unmounted"

step "many shards, one tree: $SOURCE split in two shards, mounted with --shard-dir"
shopt -s nullglob
first=("$SOURCE"/[a-l]*) rest=("$SOURCE"/[!a-l]*)
shopt -u nullglob
[ ${#first[@]} -gt 0 ] && shardfs create "$work/shards/a-l.shard" "${first[@]}"
[ ${#rest[@]} -gt 0 ] && shardfs create "$work/shards/other.shard" "${rest[@]}"
shardfs mount --shard-dir "$work/shards" --layout fanout --cache-dir "$work/cache" "$many"
echo "root of the fan-out layout (slicing 0:2/2:4): $(ls "$many" | head -8 | tr '\n' ' ')..."
if [ -n "$sample" ]; then
    echo "$sample is $many/${key:0:2}/${key:2:2}/$key, from shard $(python3 -c \
        "import os, sys; print(os.getxattr(sys.argv[1], 'user.shardfs.shard').decode())" "$many/$key")"
fi
echo "objects in the tree: $(find "$many" -type f | wc -l) (objects in $shard: $(shardfs ls "$shard" | wc -l))"

step "a new shard appears in the directory: served within seconds, no remount"
extra=/usr/lib/os-release
[ -f "$extra" ] || extra=$sample
newkey=$(sha256sum "$extra" | cut -d' ' -f1)
echo "demo $(date)" > "$work/note.txt"
notekey=$(sha256sum "$work/note.txt" | cut -d' ' -f1)
shardfs create "$work/shards/new.shard" "$work/note.txt" "$extra"
for _ in $(seq 50); do [ -e "$many/$notekey" ] && break; sleep 0.1; done
echo "cat $many/${notekey:0:2}/${notekey:2:2}/$notekey:"
cat "$many/${notekey:0:2}/${notekey:2:2}/$notekey"
[ "$(sha256sum < "$many/$newkey" | cut -d' ' -f1)" = "$newkey" ]
echo "$extra read back by its key: sha256sum matches"

step "a takedown: shardfs delete in place reaches the mount, kernel caches included"
python3 -c "import json, os, sys; w = json.loads(os.getxattr(sys.argv[1], 'user.shardfs.stats'))['workers']; \
print(f'the mount is served by {len(w)} worker processes (requests so far: {w})')" "$many"
shardfs delete --yes "$work/shards/new.shard" "$notekey"
for _ in $(seq 50); do [ -e "$many/$notekey" ] || break; sleep 0.1; done
if [ -e "$many/$notekey" ]; then echo "deleted object still served"; exit 1; fi
echo "$many/$notekey: gone (deleted from new.shard)"

step "shardfs umount $many"
shardfs umount "$many"
echo "unmounted; demo done"
