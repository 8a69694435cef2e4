{{/* The release's name prefix of every object (63 characters at most, as Kubernetes names). */}}
{{- define "argusdiff.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "argusdiff.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "argusdiff.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "argusdiff.secretName" -}}
{{- default (include "argusdiff.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "argusdiff.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "argusdiff.fullname" .) -}}
{{- else -}}
{{- required "redis.url is required when redis.enabled is false" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{- define "argusdiff.qdrantUrl" -}}
{{- if .Values.qdrant.enabled -}}
{{- printf "http://%s-qdrant:6333" (include "argusdiff.fullname" .) -}}
{{- else -}}
{{- .Values.qdrant.url -}}
{{- end -}}
{{- end -}}

{{/* The environment every router and worker gets: connections, the Redis namespace, secrets. */}}
{{- define "argusdiff.env" -}}
- name: ARGUSDIFF_SERVICE__REDIS_URL
  value: {{ include "argusdiff.redisUrl" . | quote }}
- name: ARGUSDIFF_SERVICE__NAMESPACE
  value: {{ .Values.redisNamespace | quote }}
{{- with include "argusdiff.qdrantUrl" . }}
- name: ARGUSDIFF_CACHE__QDRANT_URL
  value: {{ . | quote }}
{{- end }}
- name: ARGUSDIFF_CACHE__S3_BUCKET
  value: {{ .Values.s3.bucket | quote }}
- name: ARGUSDIFF_CACHE__S3_REGION
  value: {{ .Values.s3.region | quote }}
{{- with .Values.s3.endpoint }}
- name: ARGUSDIFF_CACHE__S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: ARGUSDIFF_SERVICE__API_KEYS
  valueFrom:
    secretKeyRef: {name: {{ include "argusdiff.secretName" . }}, key: api-keys}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ include "argusdiff.secretName" . }}, key: s3-access-key-id, optional: true}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "argusdiff.secretName" . }}, key: s3-secret-access-key, optional: true}
{{- with .Values.otlpEndpoint }}
- name: ARGUSDIFF_SERVICE__OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: HF_HUB_OFFLINE
  value: "1"
{{- end -}}
