// Alt text for the figures inside stored widget views (scripts/build_site.py).
// The widget manager (embed.js) draws an Output widget's PNG without the "alt" its output
// metadata carries; this copies it across, matching each <img> to its output by the image data.
(function () {
  "use strict";
  var PREFIX = "data:image/png;base64,";
  var altOf = null;

  function readState() {  // the state script sits at the end of the page: read it once it is there
    altOf = {};
    document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]').forEach(function (el) {
      var state = JSON.parse(el.textContent).state || {};
      Object.keys(state).forEach(function (id) {
        ((state[id].state || {}).outputs || []).forEach(function (out) {
          var png = out.data && out.data["image/png"];
          var md = (out.metadata || {})["image/png"] || {};
          if (png && md.alt) altOf[String(png).replace(/\s/g, "")] = md.alt;
        });
      });
    });
  }

  function label(root) {
    if (altOf === null) return;
    var imgs = root.querySelectorAll ? root.querySelectorAll("img") : [];
    Array.prototype.forEach.call(imgs, function (img) {
      var src = img.getAttribute("src") || "";
      if (img.getAttribute("alt") || src.indexOf(PREFIX) !== 0) return;
      var alt = altOf[src.slice(PREFIX.length)];
      if (alt) img.setAttribute("alt", alt);
    });
  }

  new MutationObserver(function (records) {
    records.forEach(function (r) {
      Array.prototype.forEach.call(r.addedNodes, function (n) {
        if (n.nodeType === 1) label(n.parentNode || n);
      });
    });
  }).observe(document.documentElement, { childList: true, subtree: true });

  document.addEventListener("DOMContentLoaded", function () {
    readState();
    label(document);
  });
})();
