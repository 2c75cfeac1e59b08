module github.com/norskvideo/automanager/tools/node/cmd

go 1.26
