{{- define "farm.env" -}}
- name: FARM_BROKER_URL
  value: {{ .Values.brokerUrl | quote }}
- name: FARM_RUNNER
  value: {{ .Values.runner | quote }}
- name: FARM_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (printf "%s-db" .Release.Name) .Values.existingSecret }}
      key: FARM_DATABASE_URL
{{- end -}}
{{- define "farm.image" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}
