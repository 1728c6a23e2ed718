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

{{/* True (non-empty) when the server runs on a GPU. */}}
{{- define "echokv.cuda" -}}
{{- if hasPrefix "cuda" .Values.server.device }}true{{ end }}
{{- end }}

{{/* The server image: the CUDA image (gpu.image) on a GPU, else image. */}}
{{- define "echokv.image" -}}
{{- if include "echokv.cuda" . }}
{{- printf "%s:%s" (required "gpu.image.repository (an image built with CUDA) is required when server.device is cuda: deploy/Dockerfile builds a CPU-only image (Debian's LibTorch has no CUDA)" .Values.gpu.image.repository) (default .Chart.AppVersion .Values.gpu.image.tag) }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "echokv.imagePullPolicy" -}}
{{- if include "echokv.cuda" . }}{{ .Values.gpu.image.pullPolicy }}{{ else }}{{ .Values.image.pullPolicy }}{{ end }}
{{- end }}

{{/* The server's listen address (--host): server.host, else the wildcard of
     network.ipFamily. An IPv6 wildcard on an IPv4-only node fails to bind when the
     kernel has IPv6 off, and the reverse serves nothing. */}}
{{- define "echokv.serverHost" -}}
{{- if .Values.server.host }}{{ .Values.server.host }}
{{- else if eq .Values.network.ipFamily "ipv4" }}0.0.0.0
{{- else }}[::]
{{- end }}
{{- end }}

{{/* An Envoy socket_address for `port` on every address of network.ipFamily:
     (dict "ctx" $ "port" N). */}}
{{- define "echokv.envoyListen" -}}
{{- $fam := .ctx.Values.network.ipFamily -}}
socket_address:
  address: {{ if eq $fam "ipv4" }}0.0.0.0{{ else }}"::"{{ end }}
  port_value: {{ int64 .port }}
  {{- if eq $fam "dual" }}
  ipv4_compat: true
  {{- end }}
{{- end }}

{{/* Envoy's dns_lookup_family for the pods' names. */}}
{{- define "echokv.dnsFamily" -}}
{{- $fam := .Values.network.ipFamily }}
{{- if eq $fam "ipv4" }}V4_ONLY{{ else if eq $fam "ipv6" }}V6_ONLY{{ else }}AUTO{{ end }}
{{- end }}

{{/* Service spec lines for network.ipFamily. */}}
{{- define "echokv.serviceFamilies" -}}
{{- $fam := .Values.network.ipFamily }}
{{- if eq $fam "dual" -}}
ipFamilyPolicy: PreferDualStack
ipFamilies: [IPv4, IPv6]
{{- else -}}
ipFamilyPolicy: SingleStack
ipFamilies: [{{ if eq $fam "ipv4" }}IPv4{{ else }}IPv6{{ end }}]
{{- end }}
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

{{/* GPU values: one device per pod, with a CUDA image; fail clearly otherwise. */}}
{{- define "echokv.checkDevice" -}}
{{- $cuda := include "echokv.cuda" . }}
{{- $count := int64 .Values.gpu.count }}
{{- if and $cuda (ne $count 1) }}
{{- fail (printf "server.device=%s needs gpu.count=1 (got %d): the pod gets no GPU otherwise, and echokv-server uses one device" .Values.server.device $count) }}
{{- end }}
{{- if and (not $cuda) (gt $count 0) }}
{{- fail (printf "gpu.count=%d with server.device=%s: the GPU would sit idle; set server.device=cuda (and gpu.image) or gpu.count=0" $count .Values.server.device) }}
{{- end }}
{{- if and $cuda (ne .Values.server.device "cuda") (ne .Values.server.device "cuda:0") }}
{{- fail (printf "server.device=%s: a pod sees its one GPU as cuda:0; use cuda or cuda:0" .Values.server.device) }}
{{- end }}
{{- if and (eq .Values.compression.cacheDtype "int8") (or $cuda (ne .Values.server.dtype "float32")) }}
{{- fail (printf "compression.cacheDtype=int8 needs server.device=cpu and server.dtype=float32 (got %s, %s): the int8 retained tier is built for the CPU float32 path" .Values.server.device .Values.server.dtype) }}
{{- end }}
{{- if and $cuda (gt (int64 .Values.gpu.memoryBytes) 0) }}
{{- $need := add (int64 .Values.model.sizeBytes) (int64 .Values.limits.maxKvBytes) }}
{{- $have := div (mul (int64 .Values.gpu.memoryBytes) 9) 10 }}
{{- if gt $need $have }}
{{- fail (printf "model.sizeBytes + limits.maxKvBytes = %d bytes of device memory, more than 90%% of gpu.memoryBytes (%d): lower limits.maxKvBytes" $need $have) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The CPU request as a number of cores (0 when none): "2500m" -> 2.5. */}}
{{- define "echokv.cpuRequestMillis" -}}
{{- $cpu := dig "requests" "cpu" "" .Values.resources }}
{{- if kindIs "string" $cpu }}
{{- if eq $cpu "" }}0
{{- else if hasSuffix "m" $cpu }}{{ trimSuffix "m" $cpu | int64 }}
{{- else }}{{ mulf (float64 $cpu) 1000 | floor | int64 }}
{{- end }}
{{- else }}{{ mulf (float64 $cpu) 1000 | floor | int64 }}
{{- end }}
{{- end }}

{{/* Compute threads (--threads): server.threads, else the CPU request rounded DOWN to
     whole cores, at least 1 (2500m -> 2: threads beyond the CPU the pod may use make
     decode collapse); 0 = no CPU request, the server chooses. */}}
{{- define "echokv.threads" -}}
{{- if gt (int64 .Values.server.threads) 0 }}{{ int64 .Values.server.threads }}
{{- else }}
{{- $m := include "echokv.cpuRequestMillis" . | int64 }}
{{- if eq $m 0 }}0{{ else }}{{ max 1 (div $m 1000) }}{{ end }}
{{- end }}
{{- end }}

{{/* /dev/shm size in bytes on a GPU (0 on CPU), from gpu.shmSizeLimit. */}}
{{- define "echokv.shmBytes" -}}
{{- if include "echokv.cuda" . }}{{ include "echokv.quantityBytes" .Values.gpu.shmSizeLimit }}{{ else }}0{{ end }}
{{- end }}

{{/* A binary/decimal size string ("1Gi", "512M", "1048576") in bytes. */}}
{{- define "echokv.quantityBytes" -}}
{{- $q := toString . }}
{{- $units := list (list "Ki" 1024) (list "Mi" 1048576) (list "Gi" 1073741824) (list "Ti" 1099511627776) (list "k" 1000) (list "M" 1000000) (list "G" 1000000000) (list "T" 1000000000000) }}
{{- $out := "" }}
{{- range $units }}
{{- if and (eq $out "") (hasSuffix (index . 0) $q) }}
{{- $out = printf "%d" (mulf (float64 (trimSuffix (index . 0) $q)) (index . 1) | floor | int64) }}
{{- end }}
{{- end }}
{{- if eq $out "" }}{{ $out = printf "%d" (float64 $q | floor | int64) }}{{ end }}
{{- $out }}
{{- end }}

{{/* Host memory for the server container, in bytes. CPU: weights + hot KV
     (max_kv_bytes) + cold tier held in memory (max_cold_bytes, tiered memory only) +
     runtime overhead. CUDA: the weights and the hot tier live in device memory, so
     only the cold tier (pinned host memory), the overhead and /dev/shm. */}}
{{- define "echokv.memoryBytes" -}}
{{- $cold := 0 }}
{{- if eq (include "echokv.defaultMemory" .) "tiered" }}{{ $cold = int64 .Values.limits.maxColdBytes }}{{ end }}
{{- $host := add $cold (int64 .Values.memory.overheadBytes) (include "echokv.shmBytes" . | int64) }}
{{- if include "echokv.cuda" . }}{{ $host }}
{{- else }}{{ add $host (int64 .Values.model.sizeBytes) (int64 .Values.limits.maxKvBytes) }}
{{- end }}
{{- end }}

{{/* The terms of echokv.memoryBytes, for the StatefulSet's echokv.io/host-memory
     annotation: "weights W + hot K + cold C + overhead O + shm S" (bytes; the
     device-resident terms absent on CUDA). */}}
{{- define "echokv.memoryTerms" -}}
{{- $terms := list }}
{{- if not (include "echokv.cuda" .) }}
{{- $terms = append $terms (printf "weights %d" (int64 .Values.model.sizeBytes)) }}
{{- $terms = append $terms (printf "hot %d" (int64 .Values.limits.maxKvBytes)) }}
{{- end }}
{{- if eq (include "echokv.defaultMemory" .) "tiered" }}
{{- $terms = append $terms (printf "cold %d" (int64 .Values.limits.maxColdBytes)) }}
{{- end }}
{{- $terms = append $terms (printf "overhead %d" (int64 .Values.memory.overheadBytes)) }}
{{- if include "echokv.cuda" . }}
{{- $terms = append $terms (printf "shm %s" (include "echokv.shmBytes" .)) }}
{{- end }}
{{- join " + " $terms }}
{{- end }}

{{/* The memory mode sessions get by default (--default_memory). */}}
{{- define "echokv.defaultMemory" -}}
{{- if .Values.state.memory }}{{ .Values.state.memory }}{{ else if .Values.state.enabled }}tiered{{ else }}evict{{ end }}
{{- end }}

{{/* Container resources: the values, with memory computed when left "" and the GPU
     added. */}}
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

{{/* limits.shutdownGraceSeconds must let the longest generation finish. */}}
{{- define "echokv.checkShutdownGrace" -}}
{{- $rate := int64 .Values.lifecycle.slowestTokensPerSecond }}
{{- $longest := div (add (int64 .Values.limits.maxNewTokens) (sub $rate 1)) $rate }}
{{- if lt (int64 .Values.limits.shutdownGraceSeconds) $longest }}
{{- fail (printf "limits.shutdownGraceSeconds=%d is shorter than the longest generation, limits.maxNewTokens / lifecycle.slowestTokensPerSecond = %d / %d = %d s: a rollout would cut it" (int64 .Values.limits.shutdownGraceSeconds) (int64 .Values.limits.maxNewTokens) $rate $longest) }}
{{- end }}
{{- end }}

{{/* True when the preStop hook drains a pod that is scaled away. */}}
{{- define "echokv.drain" -}}
{{- if .Values.drain.enabled }}true{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: the drain + the preStop sleep + the server's
     shutdown (--shutdown_grace) + 10 s to flush state and exit, unless set
     explicitly. */}}
{{- define "echokv.terminationGrace" -}}
{{- $drain := 0 }}
{{- if include "echokv.drain" . }}{{ $drain = int64 .Values.drain.timeoutSeconds }}{{ end }}
{{- $needed := add $drain (int64 .Values.lifecycle.preStopSleepSeconds) (int64 .Values.limits.shutdownGraceSeconds) 10 }}
{{- $set := int64 .Values.terminationGracePeriodSeconds }}
{{- if eq $set 0 }}{{ $needed }}
{{- else if lt $set (sub $needed 10) }}
{{- fail (printf "terminationGracePeriodSeconds=%d is shorter than drain.timeoutSeconds + lifecycle.preStopSleepSeconds + limits.shutdownGraceSeconds = %d: the kubelet would kill streams (and state writes) mid-drain" $set (sub $needed 10)) }}
{{- else }}{{ $set }}
{{- end }}
{{- end }}

{{/* The name in the server certificate that clients inside the pods verify. */}}
{{- define "echokv.tlsServerName" -}}
{{- default (printf "%s.%s.svc" (include "echokv.fullname" .) .Release.Namespace) .Values.tls.serverName }}
{{- end }}

{{/* echokv-cli's TLS flags for a client inside a pod (probes, the drain, helm test)
     that talks to a server: verify with the server CA (mounted at
     /etc/echokv/server-ca), check `serverName` ("" = none: the address's own name),
     present the in-pod client certificate (/etc/echokv/client-tls) under mTLS. One
     flag and its value per line. (dict "ctx" $ "serverName" NAME) */}}
{{- define "echokv.cliTlsArgs" -}}
{{- $v := .ctx.Values }}
{{- if $v.tls.enabled }}
--tls-ca
{{ printf "/etc/echokv/server-ca/%s" $v.tls.caKey }}
{{- if .serverName }}
--tls-server-name
{{ .serverName }}
{{- end }}
{{- if $v.tls.clientCASecret }}
--tls-cert
/etc/echokv/client-tls/tls.crt
--tls-key
/etc/echokv/client-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/* The volumes those flags read: call with the context. */}}
{{- define "echokv.cliTlsVolumes" -}}
{{- if .Values.tls.enabled }}
- name: server-ca
  secret:
    secretName: {{ default .Values.tls.secretName .Values.tls.caSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.tls.caKey }}
        path: {{ .Values.tls.caKey }}
{{- if .Values.tls.clientCASecret }}
- name: client-tls
  secret:
    secretName: {{ required "tls.clientCertSecret (a kubernetes.io/tls Secret signed by the client CA) is required with tls.clientCASecret: the probes, the drain and helm test must present a client certificate" .Values.tls.clientCertSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}

{{- define "echokv.cliTlsMounts" -}}
{{- if .Values.tls.enabled }}
- name: server-ca
  mountPath: /etc/echokv/server-ca
  readOnly: true
{{- if .Values.tls.clientCASecret }}
- name: client-tls
  mountPath: /etc/echokv/client-tls
  readOnly: true
{{- end }}
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

{{/* The probe action: call with (dict "ctx" $ "probe" .Values.probes.liveness). The
     exec probe dials localhost and, with TLS, verifies the certificate's name
     tls.serverName (localhost is not one of its names). */}}
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
    {{- range (include "echokv.cliTlsArgs" (dict "ctx" $ctx "serverName" (include "echokv.tlsServerName" $ctx)) | trim | splitList "\n") }}
    {{- if . }}
    - {{ . | quote }}
    {{- end }}
    {{- end }}
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

{{/* Gateway routes are rendered for ordinals 0..N-1 with N = gateway.routeReplicas,
     which must cover every pod that may run: replicaCount and, with autoscaling, its
     maxReplicas. Independent of replicaCount, so scaling never changes the gateway's
     config (nor rolls its pods). */}}
{{- define "echokv.routeReplicas" -}}
{{- $n := int64 .Values.gateway.routeReplicas }}
{{- if lt $n (int64 .Values.replicaCount) }}
{{- fail (printf "gateway.routeReplicas=%d is below replicaCount=%d: the sessions of the pods above it would have no route" $n (int64 .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt $n (int64 .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "gateway.routeReplicas=%d is below autoscaling.maxReplicas=%d: the sessions of the pods above it would have no route" $n (int64 .Values.autoscaling.maxReplicas)) }}
{{- end }}
{{- $n }}
{{- end }}

{{/* The heirs of ordinal i: i/2, i/4, ..., 0 (integer halving), as a space-separated
     list. A scale-down drain moves a session whose id names pod i to the first of i,
     i/2, i/4, ..., 0 that remains; removing the highest pods never moves the others,
     so the owner or one of its heirs always holds a session. */}}
{{- define "echokv.heirs" -}}
{{- $i := int64 . }}
{{- $out := list }}
{{- range until 64 }}
{{- if gt $i 0 }}{{ $i = div $i 2 }}{{ $out = append $out $i }}{{ end }}
{{- end }}
{{- join " " $out }}
{{- end }}

{{/* True when the pods carry prometheus.io/* scrape annotations: metrics.podAnnotations
     true, or auto while no ServiceMonitor is rendered (a Prometheus that honours both
     would scrape every pod twice). */}}
{{- define "echokv.podAnnotations" -}}
{{- $a := .Values.metrics.podAnnotations }}
{{- if eq (toString $a) "auto" }}
{{- if not (include "echokv.serviceMonitor" .) }}true{{ end }}
{{- else if $a }}true
{{- end }}
{{- end }}

{{/* True when the ServiceMonitors are rendered. */}}
{{- define "echokv.serviceMonitor" -}}
{{- if and .Values.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/* podAntiAffinity over the pods with `labels`: (dict "mode" soft|hard "labels" YAML). */}}
{{- define "echokv.antiAffinity" -}}
podAntiAffinity:
  {{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- .labels | nindent 10 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- .labels | nindent 12 }}
  {{- end }}
{{- end }}

{{/* The autoscaler to render: keda, hpa, or "" when the cluster serves neither API
     the chosen provider needs. */}}
{{- define "echokv.autoscalingProvider" -}}
{{- $p := .Values.autoscaling.provider }}
{{- $keda := .Capabilities.APIVersions.Has "keda.sh/v1alpha1" }}
{{- $hpa := and (.Capabilities.APIVersions.Has "autoscaling/v2") (.Capabilities.APIVersions.Has "custom.metrics.k8s.io/v1beta1") }}
{{- if .Values.autoscaling.enabled }}
{{- if and (has $p (list "auto" "keda")) $keda }}keda
{{- else if and (has $p (list "auto" "hpa")) $hpa }}hpa
{{- end }}
{{- end }}
{{- end }}

{{/* HPA scaling behavior: scale up promptly, down slowly and one pod at a time (each
     pod that goes drains its sessions first). */}}
{{- define "echokv.scaleBehavior" -}}
scaleUp:
  stabilizationWindowSeconds: 0
  policies:
    - type: Pods
      value: 2
      periodSeconds: 60
scaleDown:
  stabilizationWindowSeconds: {{ int64 .Values.autoscaling.scaleDown.stabilizationSeconds }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: 1
      periodSeconds: {{ int64 .Values.autoscaling.scaleDown.periodSeconds }}
{{- end }}
