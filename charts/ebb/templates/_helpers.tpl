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

{{/*
"true" when the components serve their metrics over HTTPS
(monitoring.secureMetrics, or a ServiceMonitor that scrapes them), else
empty. Checks the ports: a metrics port equal to another would keep the
component from serving it.
*/}}
{{- define "ebb.secureMetrics" -}}
{{- $ports := list (toString .Values.lb.metricsPort) (toString .Values.nodeAgent.metricsPort) "10266" -}}
{{- if ne (len (uniq $ports)) 3 -}}
{{- fail "lb.metricsPort, nodeAgent.metricsPort and the node-agent's health port 10266 must differ" -}}
{{- end -}}
{{- if or .Values.monitoring.secureMetrics .Values.monitoring.serviceMonitor.enabled -}}true{{- end -}}
{{- end -}}
