module github.com/hybridlimit/hybrid/envoyrls

go 1.25.0

require gopkg.in/yaml.v2 v2.4.0
