{{/*
Named templates shared by every manifest. Numbers: Helm reads every YAML number of
the values as a float64, so a template that prints one directly writes 4e+06 for
4000000 -- every number below goes through int64 (or echokv.flagValue).
*/}}

{{/* Chart name, truncated to the 63 characters DNS labels allow. */}}
{{- define "echokv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release already contains it.
     The StatefulSet's pods are "<fullname>-<ordinal>" and Kubernetes labels each pod
     with "<fullname>-<10-char hash>", so the name must stay within 52 characters. */}}
{{- define "echokv.fullname" -}}
{{- $name := "" }}
{{- if .Values.fullnameOverride }}
{{- $name = .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $chart := default .Chart.Name .Values.nameOverride }}
{{- if contains $chart .Release.Name }}
{{- $name = .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name = printf "%s-%s" .Release.Name $chart | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- if gt (len $name) 52 }}
{{- fail (printf "the release's full name %q has %d characters; StatefulSet pod names need at most 52 (set fullnameOverride)" $name (len $name)) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The headless Service that gives every pod a DNS name
     <pod>.<headless>.<namespace>.svc.<clusterDomain>. */}}
{{- define "echokv.headlessName" -}}
{{- printf "%s-headless" (include "echokv.fullname" .) }}
{{- end }}

{{- define "echokv.gatewayName" -}}
{{- printf "%s-gateway" (include "echokv.fullname" .) }}
{{- end }}

{{/* <headless>.<namespace>.svc.<clusterDomain>: the per-pod names live under it. */}}
{{- define "echokv.headlessDomain" -}}
{{- printf "%s.%s.svc.%s" (include "echokv.headlessName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{- define "echokv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object of the release. */}}
{{- define "echokv.commonLabels" -}}
helm.sh/chart: {{ include "echokv.chart" . }}
app.kubernetes.io/name: {{ include "echokv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: echokv
{{- end }}

{{/* Server objects: common labels + component=server. */}}
{{- define "echokv.labels" -}}
{{ include "echokv.commonLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/* Server pod selector (immutable once the StatefulSet exists). The component keeps
     the gateway's and the test's pods out of the server Services. */}}
{{- define "echokv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "echokv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "echokv.gatewayLabels" -}}
{{ include "echokv.commonLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "echokv.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ include "echokv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* Pods carrying this label may reach the server ports when networkPolicy.enabled. */}}
{{- define "echokv.clientLabel" -}}
{{- printf "%s-client" (include "echokv.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "echokv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "echokv.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "echokv.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* One flag value as echokv-server parses it: integral numbers as integers (never
     4e+06), other numbers as Go prints them, booleans and strings as they are. */}}
{{- define "echokv.flagValue" -}}
{{- if kindIs "float64" . }}
{{- if eq . (floor .) }}{{ printf "%d" (int64 .) }}{{ else }}{{ printf "%v" . }}{{ end }}
{{- else if kindIs "invalid" . }}
{{- else }}{{ printf "%v" . }}
{{- end }}
{{- end }}

{{/* True (non-empty) when a model volume is mounted; "" runs the embedded model. */}}
{{- define "echokv.hasModelVolume" -}}
{{- if ne .Values.model.source.type "" }}true{{ end }}
{{- end }}

{{/* The directory the server loads: the mounted volume's model folder, or the image's
     embedded stories260K. */}}
{{- define "echokv.modelPath" -}}
{{- if include "echokv.hasModelVolume" . }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) .Values.model.subPath | clean }}
{{- else }}
{{- "/opt/echokv/models/stories260K" }}
{{- end }}
{{- end }}

{{/* The state directory (--state_dir): a folder of the volume, not its root, which
     may hold lost+found. The entrypoint creates it. */}}
{{- define "echokv.stateDir" -}}
{{- printf "%s/sessions" (trimSuffix "/" .Values.state.mountPath) }}
{{- end }}

{{/* GPU values need an image with CUDA: fail clearly otherwise. */}}
{{- define "echokv.checkDevice" -}}
{{- $cuda := hasPrefix "cuda" .Values.server.device }}
{{- if and (or $cuda (gt (int64 .Values.gpu.count) 0)) (not .Values.image.cuda) }}
{{- fail (printf "server.device=%s / gpu.count=%d need an image built with CUDA, and image.cuda is false: deploy/Dockerfile builds a CPU-only image (Debian's LibTorch has no CUDA). Use server.device=cpu and gpu.count=0, or build a CUDA image and set image.cuda=true" .Values.server.device (int64 .Values.gpu.count)) }}
{{- end }}
{{- if and $cuda (eq (int64 .Values.gpu.count) 0) }}
{{- fail (printf "server.device=%s needs gpu.count >= 1 (the pod gets no GPU otherwise)" .Values.server.device) }}
{{- end }}
{{- end }}

{{/* Memory for the server container, in bytes: weights + hot KV (max_kv_bytes) + cold
     tier held in memory (max_cold_bytes, tiered memory only) + runtime overhead. */}}
{{- define "echokv.memoryBytes" -}}
{{- $cold := 0 }}
{{- if eq (include "echokv.defaultMemory" .) "tiered" }}{{ $cold = int64 .Values.limits.maxColdBytes }}{{ end }}
{{- add (int64 .Values.model.sizeBytes) (int64 .Values.limits.maxKvBytes) $cold (int64 .Values.memory.overheadBytes) }}
{{- end }}

{{/* The memory mode sessions get by default (--default_memory). */}}
{{- define "echokv.defaultMemory" -}}
{{- if .Values.state.memory }}{{ .Values.state.memory }}{{ else if .Values.state.enabled }}tiered{{ else }}evict{{ end }}
{{- end }}

{{/* Container resources: the values, with memory computed when left "" and the GPU
     count added. */}}
{{- define "echokv.resources" -}}
{{- $res := deepCopy .Values.resources }}
{{- $requests := default (dict) $res.requests }}
{{- $limits := default (dict) $res.limits }}
{{- $mi := printf "%dMi" (div (add (include "echokv.memoryBytes" . | int64) 1048575) 1048576) }}
{{- if not $requests.memory }}{{ $_ := set $requests "memory" $mi }}{{ end }}
{{- if not $limits.memory }}{{ $_ := set $limits "memory" $requests.memory }}{{ end }}
{{- if gt (int64 .Values.gpu.count) 0 }}
{{- $_ := set $limits .Values.gpu.resourceName (int64 .Values.gpu.count) }}
{{- end }}
{{- $_ := set $res "requests" $requests }}
{{- $_ := set $res "limits" $limits }}
{{- toYaml $res }}
{{- end }}

{{/* terminationGracePeriodSeconds: the preStop sleep + the server's drain
     (--shutdown_grace) + 10 s to flush state and exit, unless set explicitly. */}}
{{- define "echokv.terminationGrace" -}}
{{- $needed := add (int64 .Values.lifecycle.preStopSleepSeconds) (int64 .Values.limits.shutdownGraceSeconds) 10 }}
{{- $set := int64 .Values.terminationGracePeriodSeconds }}
{{- if eq $set 0 }}{{ $needed }}
{{- else if lt $set (sub $needed 10) }}
{{- fail (printf "terminationGracePeriodSeconds=%d is shorter than lifecycle.preStopSleepSeconds + limits.shutdownGraceSeconds = %d: the kubelet would kill streams (and state writes) mid-drain" $set (sub $needed 10)) }}
{{- else }}{{ $set }}
{{- end }}
{{- end }}

{{/* Probe kind: grpc (kubelet's native gRPC probe, GA in Kubernetes 1.27) or exec
     (echokv-cli health inside the container). auto picks exec below 1.27 and when the
     server speaks TLS, which kubelet's gRPC probe cannot. */}}
{{- define "echokv.probeMode" -}}
{{- $mode := .Values.probes.mode }}
{{- if eq $mode "auto" }}
{{- if or .Values.tls.enabled (not (semverCompare ">=1.27.0-0" .Capabilities.KubeVersion.Version)) }}exec{{ else }}grpc{{ end }}
{{- else if and (eq $mode "grpc") .Values.tls.enabled }}
{{- fail "probes.mode=grpc cannot check a TLS server (kubelet's gRPC probe speaks plaintext): use probes.mode=exec or auto" }}
{{- else }}{{ $mode }}
{{- end }}
{{- end }}

{{/* The probe action: call with (dict "ctx" $ "probe" .Values.probes.liveness). */}}
{{- define "echokv.probe" -}}
{{- $ctx := .ctx }}
{{- if eq (include "echokv.probeMode" $ctx) "grpc" -}}
grpc:
  port: {{ int64 $ctx.Values.ports.grpc }}
  service: {{ $ctx.Values.probes.service | quote }}
{{- else -}}
exec:
  command:
    - echokv-cli
    - --server
    - {{ printf "localhost:%d" (int64 $ctx.Values.ports.grpc) | quote }}
    - --timeout
    - {{ printf "%d" (max 1 (sub (int64 .probe.timeoutSeconds) 1)) | quote }}
    {{- range $ctx.Values.probes.exec.extraArgs }}
    - {{ . | quote }}
    {{- end }}
    - health
    - --service
    - {{ $ctx.Values.probes.service | quote }}
{{- end }}
periodSeconds: {{ int64 .probe.periodSeconds }}
failureThreshold: {{ int64 .probe.failureThreshold }}
timeoutSeconds: {{ int64 .probe.timeoutSeconds }}
{{- end }}
