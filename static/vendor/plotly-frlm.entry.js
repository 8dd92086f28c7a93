// FRLM's Plotly bundle: plotly.js's core (scatter and the cartesian axes) with the bar and
// heatmap traces, the only trace types the pages draw. How to rebuild it:
// static/vendor/README.md.
var Plotly = require("plotly.js/lib/core");
Plotly.register([require("plotly.js/lib/bar"), require("plotly.js/lib/heatmap")]);
module.exports = Plotly;
