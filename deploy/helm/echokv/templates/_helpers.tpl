{{/* Chart name, truncated to the 63 characters DNS labels allow. */}}
{{- define "echokv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release already contains it. */}}
{{- define "echokv.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "echokv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "echokv.labels" -}}
helm.sh/chart: {{ include "echokv.chart" . }}
{{ include "echokv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
app.kubernetes.io/part-of: echokv
{{- end }}

{{/* Selector labels (immutable once deployed). */}}
{{- define "echokv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "echokv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
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

{{/* The PVC name when the chart creates one. */}}
{{- define "echokv.modelClaimName" -}}
{{- if eq .Values.model.source.type "existingClaim" }}
{{- required "model.source.existingClaim is required when model.source.type is existingClaim" .Values.model.source.existingClaim }}
{{- else }}
{{- printf "%s-model" (include "echokv.fullname" .) }}
{{- end }}
{{- end }}

{{/* True (non-empty) when a model volume is mounted. */}}
{{- define "echokv.hasModelVolume" -}}
{{- $t := .Values.model.source.type }}
{{- if has $t (list "pvc" "existingClaim" "hostPath" "volume") }}true{{ else if ne $t "" }}
{{- fail (printf "model.source.type must be one of \"\", pvc, existingClaim, hostPath, volume (got %q)" $t) }}
{{- end }}
{{- end }}
