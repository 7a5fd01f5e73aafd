#!/usr/bin/env bash
# check_plugin_exports.sh PLUGIN.so — a plugin must export exactly one dynamic symbol, berth_plugin_entry
# (everything else hidden), so plugins cannot clash with each other or with the host.
set -euo pipefail
so="$1"
syms="$(nm -D --defined-only "$so" | awk '{print $NF}' | sort)"
if [ "$syms" != "berth_plugin_entry" ]; then
    echo "$so exports more or less than berth_plugin_entry:" >&2
    printf '%s\n' "$syms" >&2
    exit 1
fi
echo "$so: exports only berth_plugin_entry"
