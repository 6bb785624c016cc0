#!/bin/sh
# Test hook that never finishes: starts a background sleep (its pid goes to "$1"), then
# waits. The runner must kill both (the whole process group) when the timeout expires.
sleep 300 &
echo $! > "$1"
echo "hanging"
wait
