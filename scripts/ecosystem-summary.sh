#!/usr/bin/env bash
# Reads the figures the install suites print (a `make test-install` log) and prints one line:
#   ecosystem kstatus_failed_by_design=… flux_wait_blip=… doc_order_install=… roles_survive_uninstall=…
#             namespaces_rbac=N/N kubeconform_errors=… kube_score_unexplained=…
#             plugin_trace_default_install=… k8s_minors_tested=…
# A figure no test printed reads `missing`, and the script then fails: every figure is a run.
set -euo pipefail
log=${1:?usage: ecosystem-summary.sh LOG}
last() { grep -o "$1=[^ ]*" "$log" | tail -n 1 | cut -d= -f2- || true; }
or_missing() { if [ -n "$1" ]; then echo "$1"; else echo missing; fi; }
# The largest namespaces figure is the test over the most releases (1, 2 and 3 namespaces).
rbac=$(grep -o 'namespaces_rbac=[0-9]*/[0-9]*' "$log" | cut -d= -f2 | sort -t/ -k2 -n | tail -n 1 || true)
minors=$(grep -o 'k8s_server=v[0-9]*\.[0-9]*' "$log" | cut -d= -f2 | sort -u | tr '\n' ',' | sed 's/,$//' || true)
minors_count=$(if [ -n "$minors" ]; then tr ',' '\n' <<<"$minors" | wc -l; else echo 0; fi)
line="ecosystem kstatus_failed_by_design=$(or_missing "$(last kstatus_failed_by_design)")"
line+=" flux_wait_blip=$(or_missing "$(last flux_wait_blip)")"
line+=" doc_order_install=$(or_missing "$(last doc_order_install)")"
line+=" roles_survive_uninstall=$(or_missing "$(last roles_survive_uninstall)")"
line+=" namespaces_rbac=$(or_missing "$rbac")"
line+=" kubeconform_errors=$(or_missing "$(last kubeconform_errors)")"
line+=" kube_score_unexplained=$(or_missing "$(last kube_score_unexplained)")"
# install_operator's on-call step: trace and what-if through the apiserver, no debugging port.
line+=" plugin_trace_default_install=$(or_missing "$(last plugin_trace_default_install)")"
line+=" k8s_minors_tested=${minors_count}(${minors:-none})"
echo "$line"
if grep -q '=missing' <<<"$line"; then
  echo "ecosystem-summary: a figure was not printed by its test (see $log)" >&2
  exit 1
fi
