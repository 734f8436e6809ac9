{{/* ebb's image, by digest when one is given. */}}
{{- define "ebb.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The container's image and pull policy. */}}
{{- define "ebb.imageFields" -}}
image: {{ include "ebb.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/*
A pod template's annotations: the chart's own, the user's, and a checksum
of the leaving signals, so that changing them rolls the pods that read
them at start. Takes a dict: root, own (a map), extra (a map).
*/}}
{{- define "ebb.podAnnotations" -}}
{{- $a := merge (dict) .extra .own -}}
{{- if $a }}
annotations:
  {{- toYaml $a | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod spec's image pull secrets. */}}
{{- define "ebb.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The objects of config/ in files/config/DIR (make generate copies them from
kustomize's render of config/default; charts/chart_test.go), in the
release's namespace instead of ebb-system. Takes a dict: root, dir.
*/}}
{{- define "ebb.configObjects" -}}
{{- $root := .root -}}
{{- range $path, $_ := $root.Files.Glob (printf "files/config/%s/*.yaml" .dir) }}
---
{{ $root.Files.Get $path | replace "ebb-system" $root.Release.Namespace }}
{{- end }}
{{- end -}}
