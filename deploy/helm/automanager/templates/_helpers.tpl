{{/* The chart's name, or nameOverride. */}}
{{- define "automanager.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The base of every object name: fullnameOverride, or <release>-<chart> (just <release> when it already holds the chart's name). */}}
{{- define "automanager.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "automanager.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every namespaced object of the release: namespaceOverride, or the release's. */}}
{{- define "automanager.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the chart's, then commonLabels (which may not replace them). */}}
{{- define "automanager.labels" -}}
{{- $own := dict "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-") "app.kubernetes.io/managed-by" .Release.Service "app.kubernetes.io/part-of" "automanager" "app.kubernetes.io/version" .Chart.AppVersion -}}
{{- toYaml (merge $own (.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/* Selector labels of the operator pods. */}}
{{- define "automanager.selectorLabels" -}}
app.kubernetes.io/name: {{ include "automanager.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The labels of a Deployment's Pods, one key each: commonLabels, then podLabels over them,
then the selector labels over both. A selector label keeps the chart's value whatever the
values say: the Deployment's selector cannot change after install, and Pods that did not match
it would be refused. Called with (dict "root" $ "selector" <the selector labels' YAML> "podLabels" <map>). */}}
{{- define "automanager.podLabels" -}}
{{- $labels := dict -}}
{{- $_ := merge $labels (fromYaml .selector) (.podLabels | default dict) (.root.Values.commonLabels | default dict) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* A Pod's affinity: `affinity` as given (or, when empty, `default`; with "user" false, only
`default`), with a required node affinity to `image.architectures` added to every node selector
term, so no Pod of the image lands on a node whose architecture it cannot run on.
Called with (dict "root" $ "default" <map> "user" <bool>). */}}
{{- define "automanager.affinity" -}}
{{- $v := .root.Values -}}
{{- $given := ternary $v.affinity dict (.user | default false) -}}
{{- $affinity := deepCopy (default (.default | default dict) $given | default dict) -}}
{{- with $v.image.architectures -}}
{{- $arch := dict "key" "kubernetes.io/arch" "operator" "In" "values" . -}}
{{- $node := $affinity.nodeAffinity | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range (get $required "nodeSelectorTerms" | default (list dict)) -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $arch) -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}
{{- toYaml $affinity -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of the simulator pod. */}}
{{- define "automanager.simSelectorLabels" -}}
app.kubernetes.io/name: {{ include "automanager.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager-sim
{{- end -}}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "automanager.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "automanager.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "automanager.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is required: no image is published for you. Build and push one (make dist REGISTRY=registry.example.com/team) and set image.repository (and image.digest) to what it printed; docs/install.md" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The simulator's Service name and Manager's URL (the simulator's when it runs). */}}
{{- define "automanager.simName" -}}
{{- printf "%s-manager-sim" (include "automanager.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "automanager.managerUrl" -}}
{{- if .Values.managerSim.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "automanager.simName" .) (include "automanager.namespace" .) (int .Values.managerSim.port) -}}
{{- else -}}
{{- .Values.manager.url -}}
{{- end -}}
{{- end -}}

{{/* The Secrets the operator mounts: none with the simulator. */}}
{{- define "automanager.tlsSecret" -}}
{{- if not .Values.managerSim.enabled }}{{ .Values.manager.tls.secretName }}{{ end -}}
{{- end -}}
{{- define "automanager.tokenSecret" -}}
{{- if not .Values.managerSim.enabled }}{{ .Values.manager.token.secretName }}{{ end -}}
{{- end -}}

{{/* Where the Secrets are mounted in the operator's container. */}}
{{- define "automanager.tlsDir" -}}/var/run/secrets/automanager/manager-tls{{- end -}}
{{- define "automanager.tokenDir" -}}/var/run/secrets/automanager/manager-token{{- end -}}
{{- define "automanager.configDir" -}}/etc/automanager{{- end -}}

{{/* The operator's settings file (docs/operator-config.md), from the values. */}}
{{- define "automanager.operatorConfig" -}}
{{- $c := .Values.config -}}
{{- $manager := dict "url" (include "automanager.managerUrl" .) "connectTimeout" .Values.manager.connectTimeout "requestTimeout" .Values.manager.requestTimeout "syncTimeout" .Values.manager.syncTimeout "heartbeatInterval" .Values.manager.heartbeatInterval "idleTimeout" .Values.manager.idleTimeout "readinessGrace" .Values.manager.readinessGrace -}}
{{- if include "automanager.tokenSecret" . -}}
{{- $_ := set $manager "tokenFile" (printf "%s/token" (include "automanager.tokenDir" .)) -}}
{{- end -}}
{{- if include "automanager.tlsSecret" . -}}
{{- $tls := dict "caFile" (printf "%s/ca.crt" (include "automanager.tlsDir" .)) -}}
{{- if .Values.manager.tls.clientCertificate -}}
{{- $_ := set $tls "certFile" (printf "%s/tls.crt" (include "automanager.tlsDir" .)) -}}
{{- $_ := set $tls "keyFile" (printf "%s/tls.key" (include "automanager.tlsDir" .)) -}}
{{- end -}}
{{- if .Values.manager.tls.domain -}}
{{- $_ := set $tls "domain" .Values.manager.tls.domain -}}
{{- end -}}
{{- $_ := set $manager "tls" $tls -}}
{{- end -}}
{{- $http := dict "bindAddress" (printf "0.0.0.0:%d" (int .Values.metrics.port)) -}}
{{- if .Values.debug.enabled -}}
{{- $host := ternary (printf "[%s]" .Values.debug.address) .Values.debug.address (contains ":" .Values.debug.address) -}}
{{- $_ := set $http "debugBindAddress" (printf "%s:%d" $host (int .Values.debug.port)) -}}
{{- end -}}
{{- /* Every key under `config` reaches the operator as written; the chart owns only the
keys it derives from other values (where Manager is, the ports, the Lease's name). */ -}}
{{- $out := deepCopy $c -}}
{{- $le := deepCopy ($c.leaderElection | default dict) -}}
{{- $_ := set $le "leaseName" (include "automanager.fullname" .) -}}
{{- $_ := set $le "leaseNamespace" (include "automanager.namespace" .) -}}
{{- $_ := set $out "leaderElection" $le -}}
{{- $_ := set $out "manager" $manager -}}
{{- $_ := set $out "http" $http -}}
{{- toYaml $out -}}
{{- end -}}
