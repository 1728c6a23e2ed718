package main

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
)

// DefaultKubeVersion is .Capabilities.KubeVersion without --kube-version (Helm uses
// the Kubernetes version its client library was built against; this is a recent one).
const DefaultKubeVersion = "1.29.0"

// defaultAPIVersions is .Capabilities.APIVersions without --api-versions: the
// built-in groups of a Kubernetes 1.29 API server (Helm's chartutil.DefaultVersionSet
// lists the versions its client library knows). CRD groups such as
// monitoring.coreos.com/v1 are absent, as on a cluster without them.
var defaultAPIVersions = []string{
	"v1",
	"admissionregistration.k8s.io/v1",
	"apiextensions.k8s.io/v1",
	"apiregistration.k8s.io/v1",
	"apps/v1",
	"authentication.k8s.io/v1",
	"authorization.k8s.io/v1",
	"autoscaling/v1",
	"autoscaling/v2",
	"batch/v1",
	"certificates.k8s.io/v1",
	"coordination.k8s.io/v1",
	"discovery.k8s.io/v1",
	"events.k8s.io/v1",
	"flowcontrol.apiserver.k8s.io/v1beta3",
	"networking.k8s.io/v1",
	"node.k8s.io/v1",
	"policy/v1",
	"rbac.authorization.k8s.io/v1",
	"scheduling.k8s.io/v1",
	"storage.k8s.io/v1",
}

// recursionMaxNums bounds nested include calls of one name (Helm: 1000).
const recursionMaxNums = 1000

// Options are the inputs of one render.
type Options struct {
	ChartDir    string
	ValueFiles  []string
	ReleaseName string
	Namespace   string
	KubeVersion string
	APIVersions []string
	IsUpgrade   bool
	SkipTests   bool
}

// VersionSet is .Capabilities.APIVersions; templates call .Has.
type VersionSet []string

// Has reports whether apiVersion (e.g. "monitoring.coreos.com/v1", or
// "monitoring.coreos.com/v1/ServiceMonitor") is in the set.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version string // "v1.29.0"
	Major   string
	Minor   string
}

func (k KubeVersion) String() string { return k.Version }

// GitVersion is the deprecated alias Helm keeps.
func (k KubeVersion) GitVersion() string { return k.Version }

// Capabilities is .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion map[string]string
}

// Files is .Files: the chart's non-template files.
type Files map[string][]byte

// Get returns a file's content ("" when absent), as Helm's Files.Get.
func (f Files) Get(name string) string { return string(f[name]) }

// GetBytes returns a file's content (nil when absent).
func (f Files) GetBytes(name string) []byte { return f[name] }

// Lines returns a file's lines.
func (f Files) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(string(f[name]), "\n")
}

// RenderChart loads, validates and renders a chart; it returns the manifests as
// `helm template` prints them and the rendered NOTES.txt.
func RenderChart(o Options) (string, string, error) {
	chart, err := LoadChart(o.ChartDir)
	if err != nil {
		return "", "", err
	}
	caps, err := makeCapabilities(o.KubeVersion, o.APIVersions)
	if err != nil {
		return "", "", err
	}
	if chart.Metadata.KubeVersion != "" {
		constraint, err := semver.NewConstraint(chart.Metadata.KubeVersion)
		if err != nil {
			return "", "", fmt.Errorf("Chart.yaml: kubeVersion %q: %v", chart.Metadata.KubeVersion, err)
		}
		v, _ := semver.NewVersion(caps.KubeVersion.Version)
		if !constraint.Check(v) {
			return "", "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
				chart.Metadata.KubeVersion, caps.KubeVersion.Version)
		}
	}
	user, err := MergeValueFiles(o.ValueFiles)
	if err != nil {
		return "", "", err
	}
	values := CoalesceValues(chart.Values, user)
	if err := ValidateValues(chart.Metadata.Name, chart.Schema, values); err != nil {
		return "", "", err
	}
	files := Files{}
	for _, f := range chart.Files {
		files[f.Name] = f.Data
	}
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{
			"Name":      o.ReleaseName,
			"Namespace": o.Namespace,
			"Revision":  1,
			"IsUpgrade": o.IsUpgrade,
			"IsInstall": !o.IsUpgrade,
			"Service":   "Helm",
		},
		"Chart":        chart.Metadata,
		"Capabilities": caps,
		"Files":        files,
	}
	rendered, err := renderTemplates(chart, top)
	if err != nil {
		return "", "", err
	}
	notes := ""
	var manifestFiles []File
	for _, f := range chart.Templates {
		content, ok := rendered[chart.Metadata.Name+"/"+f.Name]
		if !ok {
			continue
		}
		if strings.HasSuffix(f.Name, "NOTES.txt") {
			notes = content
			continue
		}
		manifestFiles = append(manifestFiles, File{Name: chart.Metadata.Name + "/" + f.Name, Data: []byte(content)})
	}
	out, err := SortAndPrint(manifestFiles, o.SkipTests)
	return out, notes, err
}

func makeCapabilities(kubeVersion string, extra []string) (Capabilities, error) {
	v, err := semver.NewVersion(kubeVersion)
	if err != nil {
		return Capabilities{}, fmt.Errorf("--kube-version %q: %v", kubeVersion, err)
	}
	set := append(VersionSet{}, defaultAPIVersions...)
	set = append(set, extra...)
	return Capabilities{
		KubeVersion: KubeVersion{
			Version: "v" + v.String(),
			Major:   fmt.Sprint(v.Major()),
			Minor:   fmt.Sprint(v.Minor()),
		},
		APIVersions: set,
		HelmVersion: map[string]string{"version": "v3-echokv-chart-render"},
	}, nil
}

// funcMap is Helm's engine funcMap: sprig's text functions without env/expandenv,
// plus Helm's own; include/tpl/required are bound per render.
func funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["fromYamlArray"] = fromYAMLArray
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["fromJsonArray"] = fromJSONArray
	f["include"] = func(string, interface{}) string { return "not implemented" }
	f["tpl"] = func(string, interface{}) interface{} { return "not implemented" }
	f["required"] = func(string, interface{}) (interface{}, error) { return "not implemented", nil }
	// `helm template` has no cluster: lookup always finds nothing.
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

// toYAML is Helm's toYaml: sigs.k8s.io/yaml (JSON, then YAML with sorted keys), the
// trailing newline trimmed; "" on error.
func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := make(map[string]interface{})
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func includeFun(t *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		if v, ok := includedNames[name]; ok {
			if v > recursionMaxNums {
				return "", fmt.Errorf("rendering template has a nested reference name: %s: unable to execute template", name)
			}
			includedNames[name]++
		} else {
			includedNames[name] = 1
		}
		err := t.ExecuteTemplate(&buf, name, data)
		includedNames[name]--
		return buf.String(), err
	}
}

func tplFun(parent *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(tpl string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %v", err)
		}
		t.Option("missingkey=zero")
		// Rebind include/tpl to the clone so defines inside tpl can be included.
		t.Funcs(template.FuncMap{
			"include": includeFun(t, includedNames),
			"tpl":     tplFun(t, includedNames),
		})
		t, err = t.New(parent.Name()).Parse(tpl)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %v", tpl, err)
		}
		var buf strings.Builder
		if err := t.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %v", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

// renderTemplates parses every template into one set (partials included) and
// executes each non-partial one with .Template set, as Helm's engine.render does.
func renderTemplates(chart *Chart, top map[string]interface{}) (map[string]string, error) {
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	includedNames := map[string]int{}
	fm := funcMap()
	fm["include"] = includeFun(t, includedNames)
	fm["tpl"] = tplFun(t, includedNames)
	fm["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, fmt.Errorf("%s", warn)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, fmt.Errorf("%s", warn)
		}
		return val, nil
	}
	t.Funcs(fm)

	// Helm parses deeper paths first (so a chart's own defines win over subcharts');
	// with one chart the order only decides which duplicate define is kept.
	tpls := append([]File(nil), chart.Templates...)
	sort.SliceStable(tpls, func(i, j int) bool {
		di, dj := strings.Count(tpls[i].Name, "/"), strings.Count(tpls[j].Name, "/")
		if di != dj {
			return di > dj
		}
		return tpls[i].Name < tpls[j].Name
	})
	basePath := chart.Metadata.Name + "/templates"
	for _, f := range tpls {
		name := chart.Metadata.Name + "/" + f.Name
		if _, err := t.New(name).Parse(string(f.Data)); err != nil {
			return nil, fmt.Errorf("parse error in %q: %v", name, err)
		}
	}
	out := map[string]string{}
	for _, f := range tpls {
		name := chart.Metadata.Name + "/" + f.Name
		if strings.HasPrefix(path.Base(f.Name), "_") {
			continue // partials only define named templates
		}
		vals := map[string]interface{}{}
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, cleanupExecError(name, err)
		}
		out[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// cleanupExecError shortens text/template's error the way Helm does for `fail` and
// `required`: "execution error at (file:line:col): message".
func cleanupExecError(name string, err error) error {
	msg := err.Error()
	const marker = "error calling "
	if i := strings.LastIndex(msg, marker); i >= 0 {
		// "template: NAME:L:C: executing ... error calling include: template: ...:
		// error calling fail: MSG": the outermost location, the innermost message.
		loc := strings.TrimPrefix(msg, "template: ")
		if j := strings.Index(loc, ": "); j >= 0 {
			loc = loc[:j]
		}
		rest := msg[i+len(marker):]
		if k := strings.Index(rest, ": "); k >= 0 {
			rest = rest[k+2:]
		}
		return fmt.Errorf("execution error at (%s): %s", loc, rest)
	}
	return fmt.Errorf("render error in %q: %v", name, err)
}
