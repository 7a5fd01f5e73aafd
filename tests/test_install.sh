#!/usr/bin/env bash
# test_install.sh [BUILD_DIR] — install a built tree into a temporary DESTDIR and prove that a third party can use
# it: the install layout is right, berth-plugin.pc leads to the installed headers, the out-of-tree example plugin
# (tests/example-plugin, its own meson project) builds against them alone and passes its own tests, and the
# installed berth loads it next to the installed plugins.
#
# BUILD_DIR defaults to ./build and must already be built (the install runs with --no-rebuild, so this can also
# run as a meson test). The prefix is whatever BUILD_DIR was configured with (default /usr/local). Needs meson,
# ninja, pkg-config, python3. Leaves nothing behind; set KEEP=1 to keep the temporary folder.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-build}" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/berth-install.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then echo "test_install: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
D="$work/destdir"

fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
step() { echo "test_install: $*"; }

# --- 1. install ------------------------------------------------------------------------------------------------
step "meson install -C $build --destdir $D"
meson install -C "$build" --destdir "$D" --no-rebuild --quiet >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; fail "meson install failed"; }

# The directories the build was configured with (libdir is lib/x86_64-linux-gnu on Debian, lib64 elsewhere).
eval "$(meson introspect --buildoptions "$build" | python3 -c '
import json, sys
opts = {o["name"]: o["value"] for o in json.load(sys.stdin)}
for k in ("prefix", "bindir", "libdir", "datadir", "includedir"):
    print("%s=%s" % (k, opts[k]))
')"
under_prefix() { case "$1" in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }
bin_dir="$D$(under_prefix "$bindir")"
lib_dir="$D$(under_prefix "$libdir")"
inc_dir="$D$(under_prefix "$includedir")"
data_dir="$D$(under_prefix "$datadir")"
plugin_dir="$lib_dir/berth/plugins"
runtime_plugin_dir="$(under_prefix "$libdir")/berth/plugins" # what the installed configs point at (no DESTDIR)

# --- 2. layout -------------------------------------------------------------------------------------------------
step "checking the install layout under $D$prefix"
[ -x "$bin_dir/berth" ] || fail "no executable $bin_dir/berth"
[ -d "$plugin_dir" ] || fail "no plugin folder $plugin_dir"
n_built=0
for so in "$build"/plugins/*.so; do
    [ -e "$so" ] || continue
    n_built=$((n_built + 1))
    [ -f "$plugin_dir/$(basename "$so")" ] || fail "built plugin $(basename "$so") is not installed in $plugin_dir"
done
[ "$n_built" -gt 0 ] || fail "no plugins in $build/plugins"
for need in berth-backend-cpu.so berth-model-gemma4.so; do
    [ -f "$plugin_dir/$need" ] || fail "$plugin_dir/$need missing"
done
for c in cpu cuda; do
    ini="$data_dir/berth/configs/$c.ini"
    [ -f "$ini" ] || fail "no config $ini"
    grep -Eq "^dir = $runtime_plugin_dir\$" "$ini" || fail "$ini does not point at $runtime_plugin_dir"
done
for h in plugin.h backend.h model.h; do
    [ -f "$inc_dir/berth/$h" ] || fail "no header $inc_dir/berth/$h"
    cmp -s "$src/plugin-api/berth/$h" "$inc_dir/berth/$h" || fail "$inc_dir/berth/$h differs from plugin-api/berth/$h"
done
pc="$lib_dir/pkgconfig/berth-plugin.pc"
[ -f "$pc" ] || fail "no $pc"

# --- 3. pkg-config, pointed into DESTDIR -------------------------------------------------------------------------
# The .pc says prefix=/usr/local; overriding prefix makes every path derived from it land inside $D.
export PKG_CONFIG_PATH="$lib_dir/pkgconfig"
export PKG_CONFIG="pkg-config --define-variable=prefix=$D$prefix"
cflags="$($PKG_CONFIG --cflags berth-plugin)"
case " $cflags " in *" -I$inc_dir "*) ;; *) fail "pkg-config --cflags berth-plugin gave '$cflags', not -I$inc_dir" ;; esac
got="$($PKG_CONFIG --variable=plugindir berth-plugin)"
[ "$got" = "$plugin_dir" ] || fail "plugindir is '$got', expected $plugin_dir"
for part in major minor; do
    want="$(sed -n "s/^#define BERTH_ABI_${part^^} \([0-9]*\)\$/\1/p" "$src/plugin-api/berth/plugin.h")"
    got="$($PKG_CONFIG --variable=abi_$part berth-plugin)"
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "berth-plugin.pc abi_$part is '$got', plugin.h says '$want'"
done

# --- 4. the out-of-tree example plugin ---------------------------------------------------------------------------
step "building tests/example-plugin against the installed headers"
ex="$work/example-build"
{ meson setup "$ex" "$src/tests/example-plugin" && ninja -C "$ex"; } >"$work/example.log" 2>&1 ||
    { cat "$work/example.log" >&2; fail "the example plugin did not build"; }
# It must have been compiled with the installed headers and never with the source tree's.
grep -q -- "-I$inc_dir" "$ex/compile_commands.json" || fail "example not compiled with -I$inc_dir"
if grep -q -- "plugin-api" "$ex/compile_commands.json"; then fail "example compiled against the source tree's plugin-api"; fi
[ -f "$ex/berth-backend-example.so" ] || fail "no $ex/berth-backend-example.so"
exports="$(nm -D --defined-only "$ex/berth-backend-example.so" | awk '{print $NF}')"
[ "$exports" = "berth_plugin_entry" ] || fail "example exports: $exports"
if [ -f "$ex/test_example_backend" ]; then
    meson test -C "$ex" --print-errorlogs >"$work/example-test.log" 2>&1 ||
        { cat "$work/example-test.log" >&2; fail "the example plugin's own tests failed"; }
    step "example plugin's own tests passed"
fi

# --- 5. the installed berth loads it -----------------------------------------------------------------------------
mkdir -p "$work/plugins"
cp "$ex/berth-backend-example.so" "$work/plugins/"
cat >"$work/berth.ini" <<EOF
; written by tests/test_install.sh
[plugins]
dir = $work/plugins
dir = $plugin_dir

[backend.example]
enabled = true
priority = 1

[backend.cpu]
enabled = true
priority = 10
EOF
step "$bin_dir/berth plugins --config $work/berth.ini"
set +e
out="$("$bin_dir/berth" plugins --config "$work/berth.ini" 2>&1)"
rc=$?
set -e
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || fail "berth plugins exited with $rc"
# The listing has one row per plugin: STATUS KIND NAME VERSION ABI PATH (host/cmd_plugins.c).
row() { # row PATH -> "STATUS KIND NAME" of the plugin loaded from PATH, or nothing
    printf '%s\n' "$out" | awk -v path="$1" '$NF == path && NF >= 6 { print $1, $2, $3; exit }'
}
got="$(row "$work/plugins/berth-backend-example.so")"
[ "$got" = "loaded backend example" ] ||
    fail "expected 'loaded backend example' for $work/plugins/berth-backend-example.so, got '${got:-no row}'"
printf '%s\n' "$out" | grep -Fq "[0] example (host memory):" || fail "berth plugins does not show the example's device"
for need in berth-backend-cpu.so:backend berth-model-gemma4.so:model; do
    got="$(row "$plugin_dir/${need%%:*}")"
    case "$got" in "loaded ${need##*:} "*) ;; *) fail "installed ${need%%:*} is not loaded: '${got:-no row}'" ;; esac
done
step "OK: layout, pkg-config, out-of-tree build and loading all check out"
