package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/Masterminds/semver"
	"github.com/ghodss/yaml"
)

// Metadata is Chart.yaml as Helm's chart.Metadata exposes it to templates
// (.Chart.Name, .Chart.AppVersion, ...): the same field names.
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []interface{}     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []interface{}     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

// File is one file of the chart, by its slash path relative to the chart root.
type File struct {
	Name string
	Data []byte
}

// Chart is a loaded chart directory, split as Helm's loader splits it.
type Chart struct {
	Metadata  Metadata
	Values    map[string]interface{} // values.yaml
	Schema    []byte                 // values.schema.json (nil when absent)
	Templates []File                 // templates/**
	Files     []File                 // everything else not ignored
}

// LoadChart reads a chart directory. Like Helm it requires apiVersion v2, a name and
// a SemVer version, applies .helmignore, and rejects charts with dependencies
// (subcharts are not supported by this renderer).
func LoadChart(dir string) (*Chart, error) {
	c := &Chart{}
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("Chart.yaml file is missing: %v", err)
	}
	if err := yaml.Unmarshal(raw, &c.Metadata); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %v", err)
	}
	if c.Metadata.APIVersion != "v2" {
		return nil, fmt.Errorf("Chart.yaml: apiVersion must be v2 (got %q)", c.Metadata.APIVersion)
	}
	if c.Metadata.Name == "" {
		return nil, fmt.Errorf("Chart.yaml: name is required")
	}
	if _, err := semver.StrictNewVersion(c.Metadata.Version); err != nil {
		return nil, fmt.Errorf("Chart.yaml: version %q is invalid: %v", c.Metadata.Version, err)
	}
	if len(c.Metadata.Dependencies) > 0 {
		return nil, fmt.Errorf("Chart.yaml: dependencies are not supported by echokv-chart-render")
	}
	if _, err := os.Stat(filepath.Join(dir, "charts")); err == nil {
		return nil, fmt.Errorf("charts/: subcharts are not supported by echokv-chart-render")
	}

	ignore, err := loadHelmignore(filepath.Join(dir, ".helmignore"))
	if err != nil {
		return nil, err
	}
	var names []string
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if ignore.Ignored(rel, info.IsDir()) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !info.IsDir() {
			names = append(names, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		switch {
		case name == "Chart.yaml" || name == ".helmignore":
		case name == "values.yaml":
			c.Values, err = ReadValues(data)
			if err != nil {
				return nil, fmt.Errorf("cannot load values.yaml: %v", err)
			}
		case name == "values.schema.json":
			c.Schema = data
		case strings.HasPrefix(name, "templates/"):
			c.Templates = append(c.Templates, File{Name: name, Data: data})
		default:
			c.Files = append(c.Files, File{Name: name, Data: data})
		}
	}
	if c.Values == nil {
		c.Values = map[string]interface{}{}
	}
	return c, nil
}

// ReadValues decodes a values document as Helm does (sigs.k8s.io/yaml: YAML -> JSON
// -> map[string]interface{}), so numbers are float64 and keys strings. An empty
// document gives an empty map.
func ReadValues(data []byte) (map[string]interface{}, error) {
	vals := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		return nil, err
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	return vals, nil
}

// helmignore is the subset of .helmignore rules this chart uses: one glob per line,
// `#` comments, a trailing "/" for directories only, matched against the base name
// and the whole relative path ("!" negation is refused rather than mishandled).
type helmignore struct {
	patterns []string
	dirOnly  []bool
}

func loadHelmignore(p string) (*helmignore, error) {
	h := &helmignore{}
	data, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			return nil, fmt.Errorf(".helmignore: negated rule %q is not supported by echokv-chart-render", line)
		}
		dir := strings.HasSuffix(line, "/")
		line = strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/")
		if _, err := path.Match(line, ""); err != nil {
			return nil, fmt.Errorf(".helmignore: bad pattern %q: %v", line, err)
		}
		h.patterns = append(h.patterns, line)
		h.dirOnly = append(h.dirOnly, dir)
	}
	return h, nil
}

func (h *helmignore) Ignored(rel string, isDir bool) bool {
	for i, p := range h.patterns {
		if h.dirOnly[i] && !isDir {
			continue
		}
		if ok, _ := path.Match(p, path.Base(rel)); ok {
			return true
		}
		if ok, _ := path.Match(p, rel); ok {
			return true
		}
	}
	return false
}
