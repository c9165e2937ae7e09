// A page that only records what is posted to it: where a message sent to '*' would land.
window.got = []
addEventListener("message", (event) => got.push(event.data))
