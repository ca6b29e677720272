{{/* Names and labels */}}
{{- define "farm.fullname" -}}{{ printf "%s-farm" .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- define "farm.labels" -}}
app.kubernetes.io/name: farm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "farm.selector" -}}
app.kubernetes.io/name: farm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "farm.serviceAccountName" -}}{{ default (include "farm.fullname" .) .Values.serviceAccount.name }}{{- end -}}
{{- define "farm.dbSecret" -}}
{{- if and .Values.database.existingSecret (not .Values.bundled.enabled) }}{{ .Values.database.existingSecret }}{{ else }}{{ include "farm.fullname" . }}{{ end -}}
{{- end -}}
{{- define "farm.brokerSecret" -}}
{{- if and .Values.broker.existingSecret (not .Values.bundled.enabled) }}{{ .Values.broker.existingSecret }}{{ else }}{{ include "farm.fullname" . }}{{ end -}}
{{- end -}}
{{/* The URLs the chart's Secret holds (bundled services for trials, else the values) */}}
{{- define "farm.databaseUrl" -}}
{{- if .Values.bundled.enabled -}}
postgresql+psycopg2://farm:{{ .Values.bundled.password }}@{{ include "farm.fullname" . }}-postgres:5432/farm
{{- else -}}{{ .Values.database.url }}{{- end -}}
{{- end -}}
{{- define "farm.brokerUrl" -}}
{{- if .Values.bundled.enabled -}}redis://{{ include "farm.fullname" . }}-redis:6379/0{{- else -}}{{ .Values.broker.url }}{{- end -}}
{{- end -}}
{{/* The Secret's data; its checksum goes into every pod template */}}
{{- define "farm.secretData" -}}
{{- if or .Values.bundled.enabled (not .Values.database.existingSecret) }}
FARM_DATABASE_URL: {{ include "farm.databaseUrl" . | quote }}
KEDA_POSTGRES_CONNECTION: {{ include "farm.databaseUrl" . | replace "postgresql+psycopg2://" "postgresql://" | quote }}
{{- end }}
{{- if or .Values.bundled.enabled (not .Values.broker.existingSecret) }}
FARM_BROKER_URL: {{ include "farm.brokerUrl" . | quote }}
{{- end }}
{{- include "farm.storeSecretData" . }}
{{- end -}}
{{/* The model store (docs/operators.md "The model store"): its S3 keys when given inline (else existingSecret) */}}
{{- define "farm.storeSecretData" -}}
{{- if and .Values.modelStore.accessKeyId (not .Values.modelStore.existingSecret) }}
FARM_S3_ACCESS_KEY_ID: {{ .Values.modelStore.accessKeyId | quote }}
FARM_S3_SECRET_ACCESS_KEY: {{ .Values.modelStore.secretAccessKey | quote }}
{{- end }}
{{- end -}}
{{- define "farm.storeUrl" -}}
{{- if .Values.modelStore.url }}{{ .Values.modelStore.url }}{{ else if .Values.modelStore.volumeClaim }}/store{{ else }}s3://farm-models{{ end -}}
{{- end -}}
{{/* The store's settings; .secret: the Secret that holds inline S3 keys */}}
{{- define "farm.storeEnv" -}}
- name: FARM_STORE_URL
  value: {{ include "farm.storeUrl" .root | quote }}
{{- with .root.Values.modelStore.endpoint }}
- name: FARM_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .root.Values.modelStore.region }}
- name: FARM_S3_REGION
  value: {{ . | quote }}
{{- end }}
{{- if or .root.Values.modelStore.existingSecret .root.Values.modelStore.accessKeyId }}
{{- $name := .root.Values.modelStore.existingSecret | default .secret }}
- name: FARM_S3_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ $name }}, key: FARM_S3_ACCESS_KEY_ID}}
- name: FARM_S3_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ $name }}, key: FARM_S3_SECRET_ACCESS_KEY}}
{{- end }}
{{- end -}}
{{/* A ReadWriteMany volume as the model store (modelStore.volumeClaim), mounted at /store in every farm pod */}}
{{- define "farm.storeMount" -}}
{{- if .Values.modelStore.volumeClaim }}
- {name: model-store, mountPath: /store}
{{- end }}
{{- end -}}
{{- define "farm.storeVolume" -}}
{{- if .Values.modelStore.volumeClaim }}
- name: model-store
  persistentVolumeClaim: {claimName: {{ .Values.modelStore.volumeClaim | quote }}}
{{- end }}
{{- end -}}
{{- define "farm.image" -}}
{{- $img := ternary .root.Values.gpuImage .root.Values.image (eq .kind "gpu") -}}
image: "{{ $img.repository }}:{{ $img.tag }}"
imagePullPolicy: {{ $img.pullPolicy }}
{{- end -}}
{{/* Environment of every farm container: URLs from the Secrets, settings, logs, metrics */}}
{{- define "farm.env" -}}
- name: FARM_DATABASE_URL
  valueFrom: {secretKeyRef: {name: {{ include "farm.dbSecret" . }}, key: FARM_DATABASE_URL}}
- name: FARM_BROKER_URL
  valueFrom: {secretKeyRef: {name: {{ include "farm.brokerSecret" . }}, key: FARM_BROKER_URL}}
- name: FARM_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: FARM_METRICS_PORT
  value: {{ .Values.metricsPort | quote }}
- name: FARM_METRICS_ADDR
  value: {{ .Values.metricsAddr | quote }}
{{ include "farm.storeEnv" (dict "root" . "secret" (include "farm.fullname" .)) }}
{{- range $k, $v := .Values.settings }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}
{{/* Restricted Pod Security level */}}
{{- define "farm.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
fsGroup: 65534
seccompProfile: {type: RuntimeDefault}
{{- end -}}
{{- define "farm.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}
{{/* A process-runner worker that jails untrusted models with bubblewrap (farm/sandbox.py): restricted, except
that bubblewrap needs to create namespaces (seccomp) and mount a fresh /proc (procMount Unmasked, which needs
the pod's hostUsers: false); the jail then holds each job with no capability, no secret and no writable host path */}}
{{- define "farm.jailSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
seccompProfile: {type: Unconfined}
procMount: Unmasked
{{- end -}}
{{/* Init container: wait until the migration job has brought the schema to this image's newest revision */}}
{{- define "farm.waitForMigrations" -}}
{{- if .root.Values.migrations.enabled }}
initContainers:
  - name: wait-for-migrations
    {{- include "farm.image" . | nindent 4 }}
    args: ["db", "check", "--wait", "{{ .root.Values.migrations.waitSeconds }}"]
    env:
      {{- include "farm.env" .root | nindent 6 }}
    securityContext:
      {{- include "farm.securityContext" .root | nindent 6 }}
    resources:
      {{- toYaml .root.Values.migrations.resources | nindent 6 }}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
{{- end }}
{{- end -}}
{{/* Probes on the metrics endpoint (served by the worker / scheduler process itself) */}}
{{- define "farm.probes" -}}
ports:
  - {name: metrics, containerPort: {{ .Values.metricsPort }}}
readinessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 10
  timeoutSeconds: 5
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  initialDelaySeconds: 30
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 6
{{- end -}}
{{- define "farm.podAnnotations" -}}
checksum/secret: {{ include "farm.secretData" . | sha256sum }}
checksum/settings: {{ toJson (dict "settings" .Values.settings "log" .Values.logFormat "port" .Values.metricsPort "addr" .Values.metricsAddr) | sha256sum }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{/* KEDA: the jobs a pool has to do, counted in the ledger (queued + claimed + running) */}}
{{- define "farm.poolQueues" -}}
{{- $queues := list -}}
{{- range .queues }}{{ $queues = append $queues . }}{{ end -}}
{{- if .gpuProduct }}{{ $queues = append $queues (printf "farm.gpu.%s" .gpuProduct) }}{{ end -}}
{{- toJson ($queues | uniq) -}}
{{- end -}}
